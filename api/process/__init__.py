"""The `switchyard` process: command line, config file, and serving on Hypercorn (`main.py`
is the entry point). Above the HTTP edge; beside the Ray deployment, which `main` starts for
`serve-ray`."""
