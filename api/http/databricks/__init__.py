"""The Databricks surface: serving endpoints (traffic splits over served models), their
invocations and management API, their SQLite store, and Databricks' error shape."""
