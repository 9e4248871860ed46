"""The Azure ML surface (Azure Machine Learning chat completions): POST /chat/completions and
GET /info, with Azure's api-version, extra-parameters and deployment rules and its error shape."""
