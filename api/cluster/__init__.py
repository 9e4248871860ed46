"""Switchyard on Ray Serve (`switchyard serve-ray`): many replicas of one node's stack behind
one HTTP endpoint, with prefix-aware routing and endpoint config shared by every replica.

    settings.py      the [cluster] table and the spec replicas are built from (no Ray)
    cli.py           command line -> spec -> deploy
    deploy.py        the Serve application: ingress -> replicas (router) -> config actor
    ingress.py       the HTTP ingress: prompt -> KV block hashes -> routed, streamed call
    router.py        Ray's RequestRouter over runtime/routing.py's policy
    replica.py       a replica: one node's stack, load stats, health, config subscription
    host.py          that stack on a trio thread, bridged to Ray's asyncio loop
    config_store.py  the shared serving-endpoint config: one writer actor, pushed by long-poll

Everything but settings.py and cli.py imports ray, an optional extra (`.[ray]`).
"""
