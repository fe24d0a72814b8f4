"""`flowrl serve`: the trained model behind an OpenAI-compatible server on localhost, for the agent to use.

`load.plan` picks what to load and with which engine, `model.ServedModel` answers chat completion requests
(the model's own template with tools, token ids returned, tool calls parsed by `tool_calls`), `server` is the
HTTP front, `client` points agents at it. Nothing here is imported by `import flowrl`.
"""
