"""Generation engines: below everything that generates (serve, improve, evaluate, train rollouts, the demo).

* `flowrl.engines.llama_server`: llama.cpp's own server (`llama-server`), several sequences decoded per step,
  LoRA adapters chosen per request; the engine on a CPU.
* `flowrl.engines.transformers_backend`: transformers, batching concurrent calls; the fallback.
* `flowrl.engines.llama_cpp_backend`: llama-cpp-python in-process, one sequence at a time.
* `flowrl.engines.policy`: `Policy`, the endpoint an agent runs on.

Nothing here is imported by `import flowrl`.
"""
