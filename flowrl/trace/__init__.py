"""The trace core: what one agent run is, as stored, and the one function that decides each fact about it.

- `schema`: the stored shape (`ExecutionTrace` and its parts, versions, upgrades); it imports no rules.
- `facts`: the verdicts (a run's outcome, a tool call's failure, the label, the task key, the reference answer),
  each decided by one function over the schema.
- `transcript`: the one reader and writer of the OpenAI chat format; `conversation`: a trace as a chat (prompt
  end, tool schemas); `outcomes`: the host's statements about a run; `redact`: secret masking before storage.
- `row`: `DecisionRow`, the facts a dataset build decides a trace on, computed once (a segment stores them as
  columns); `tokenizer`: the fingerprint of the tokenizer that made captured ids.

Importing this package imports none of them; `from flowrl.trace import schema` (or a module path) does.
"""
