"""The OpenAI-compatible HTTP API (and vLLM's token-in/token-out API) over an engine.

One module each: `protocol` (the request models, error bodies), `request_params` (a request's
prompts as the engine's requests with their `GenerationParams`, checked), `prompts` (prompt
rendering), `text` (a choice's text as its tokens stream, up to its stop sequences),
`responses` (whole bodies), `streaming` (server-sent chunks), `tool_calls` (the tool calls
out of a choice's text, read by a parser of `tool_parsers`, one module per format), `structured_outputs` (`response_format` and forced tool calls as a
JSON schema), `tito` (vLLM's token-in/token-out API); `serving.OpenAIServing` holds the logic
of models, completions (with `echo`) and chat, testable without HTTP; `app` holds the routes.

The sampling knobs of the logits processors (`logit_bias`, the penalties, `min_tokens`, ...)
are not named here: the request models accept the fields the registered processors read, and
each processor reads and checks its own (`rlrun.inference.logits`).

A completion's `prompt` is a string, a list of token ids, or a batch of either; choice
`i * n + j` of the answer is sample j of prompt i, as in OpenAI's API. With `best_of` > n,
`best_of` samples are drawn per prompt and the n with the highest logprob per token are
answered, best first (not streamed; `usage` counts the answered ones, as vLLM does).
`echo` with `max_tokens` 0 generates nothing: this is how harnesses score loglikelihoods.

Chat `tools` are offered to the model through its tokenizer (`render_chat`), and the tool
calls an answer writes (in the format of `inference.tool_call_parser`: Hermes, Qwen3-Coder
XML, Llama 3 JSON or Mistral; `auto` reads the tokenizer's chat template) come back as `tool_calls` with `tool_choice` "auto"
(the default); "none" leaves them in the text; "required" or a named function constrains the
answer (`structured_outputs`) and it comes back as `tool_calls` (finish_reason
"tool_calls"), or as content if `max_tokens` cut it short. One model is served: a `model`
other than its id is a 404 with code `model_not_found`, as OpenAI answers it (an absent
`model` means the one served).
"""
