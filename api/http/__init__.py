"""The HTTP edge: the app (`app.py`), one package per API surface (`openai/`, `azure/`,
`databricks/`), the layer they share (`shared/`) and the platform settings (`platform/`).
Only HTTP lives here: the process and the Ray deployment sit above it (`api/process`,
`api/cluster`), and it reaches an engine only through `runtime.protocol.Runtime`."""
