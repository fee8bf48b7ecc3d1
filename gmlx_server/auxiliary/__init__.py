"""The service host: embeddings, rerank, speech-to-text and text-to-speech beside the chat engines.

Each configured service has one worker thread of its own (MLX streams are per thread, and a long transcription
must never hold a chat engine's thread), a concurrency cap answered with the chat routes' typed 503, its own
request counters, and a model that loads on first use or at start (an hf: model downloads in the background).
The heavy libraries are the optional extra `gmlx[services]`, imported only when a service loads.
"""
