"""`gmlx launch CLIENT --model ID[@profile]`: start an agent harness against a running gmlx server.

An HTTP client of the server only (never the engine): it checks the server, keeps the model
resident, then hands the client its base URL, key, model id, window and a max output that fits.
"""
