"""Model providers: one port (`base.ModelPort`), one adapter per wire protocol.

`scripted` is offline and deterministic; `openai` speaks OpenAI-compatible
chat completions; `anthropic` the Messages API. `resilience` wraps any of
them with retries and fallbacks.
"""
