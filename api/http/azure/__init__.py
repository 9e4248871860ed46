"""The Azure ML surface (seed 003): POST /chat/completions and GET /info, with Azure's
api-version, extra-parameters and deployment rules and its error shape."""
