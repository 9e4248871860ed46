"""The serving app's `MediaPolicy` (its platform config's), for the view handling a request."""

from __future__ import annotations

from quart import current_app

from api.http.platform.media import MediaPolicy


def media_policy() -> MediaPolicy:
    config = current_app.extensions.get("platform_config")
    policy = getattr(config, "media", None)
    return policy if isinstance(policy, MediaPolicy) else MediaPolicy()
