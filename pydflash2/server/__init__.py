"""pydflash2.server: an OpenAI-compatible HTTP server over the draft-verify
engine, with continuous batching (`--parallel N` slots in one target context)
and Prometheus metrics. Run it with `pydflash2 serve` or
`python -m pydflash2.server`.

Modules: engine (native batch engine binding), scheduler (slots and the step
loop), metrics (Prometheus), schemas (OpenAI bodies), validation (what a body
may hold), app (FastAPI routes), health (/health's verdict), auth (API keys),
access_log (request ids, one log line per request), lifecycle (loading, draining on signals), main (wiring and
uvicorn); steering (grammar, penalties, logit_bias, logprobs -> the engine's
start() arguments), grammars (GBNF from response_format), tools (tool-call
formats: parsing and forcing grammars), answers (OpenAI answers and streams),
logprobs (their shapes), timings (llama-server's per-request figures),
template_routes (/tokenize, /detokenize, /apply-template)."""
