"""`flowrl serve MODEL`: an OpenAI-compatible server on localhost for an exported or trained model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from flowrl.cli.common import console, err_console
from flowrl.errors import ConfigError


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(  # noqa: PLR0913  # a typer command: one parameter per option
    model: str = typer.Argument(
        ...,
        help=(
            "A .gguf file or a folder `flowrl export` wrote (llama.cpp), an adapter folder from `flowrl train`, "
            "a Hugging Face model folder, or `default`."
        ),
    ),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (another than localhost needs --allow-remote)."),
    port: int = typer.Option(8080, help="Port (0 picks a free one)."),
    engine: str = typer.Option(
        "auto",
        help="auto (llama-server when built, else llama.cpp when installed), llama-server, llama.cpp or transformers.",
    ),
    slots: int = typer.Option(8, "--slots", min=1, help="Requests decoded together (llama-server)."),
    base_model: str | None = typer.Option(
        None, "--base-model", help="Base model of an adapter folder, overriding its adapter_config.json."
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Tokenizer folder of a .gguf file (default: the merged/ folder beside it)."
    ),
    name: str | None = typer.Option(None, "--name", help="Model name the server reports (default: from MODEL)."),
    temperature: float = typer.Option(0.7, help="Temperature of requests that set none."),
    max_tokens: int = typer.Option(512, "--max-tokens", help="Reply length limit of requests that set none."),
    ctx: int = typer.Option(4096, "--ctx", help="Context length of a request (llama.cpp, llama-server)."),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="FLOWRL_SERVE_API_KEY", help="Require `Authorization: Bearer KEY`."
    ),
    allow_remote: bool = typer.Option(False, "--allow-remote", help="Listen on a non-local --host."),
    promotions: Path | None = typer.Option(
        None,
        "--promotions",
        help=(
            "Follow this promotions.jsonl (flowrl promote, improve --promote): serve the model promoted now on "
            "MODEL, the base, and switch when a promotion or rollback is recorded, no request dropped."
        ),
    ),
) -> None:
    """Serve MODEL at http://HOST:PORT/v1 (chat completions, tools, streaming); Ctrl-C stops.

    Point a FlowAgent at it with flowrl.serve.client.use_served(agent, URL, NAME) (LiteLLM model string
    openai/NAME), or any OpenAI client with base_url=URL."""
    from flowrl.localhost import LOCAL_HOSTS, check_host  # lazy: keeps `flowrl --help` fast
    from flowrl.serve import load  # lazy: keeps `flowrl --help` fast
    from flowrl.serve.model import ServedModel  # lazy: keeps `flowrl --help` fast
    from flowrl.serve.server import REMOTE_RISK, start  # lazy: keeps `flowrl --help` fast

    check_host(host, allow_remote, "flowrl serve", REMOTE_RISK)  # before the model loads, not after
    plan = load.plan(model, engine=engine, base_model=base_model, tokenizer=tokenizer)
    options = {"max_tokens": max_tokens, "temperature": temperature, "n_ctx": ctx, "slots": slots}
    record, serving = None, None
    if promotions is not None:
        from flowrl.promote.history import History  # lazy: keeps `flowrl --help` fast

        if plan.adapter is not None or plan.gguf is not None:
            raise ConfigError(
                f"--promotions: serve the base model the promoted adapters were trained from, not {model}"
            )
        record = History(promotions)
        promoted = record.current()
        serving = Path(promoted) if promoted else None
        base_plan = plan

        def promoted_plan(adapter: Path | None) -> Any:
            """What to load for a promoted adapter: it on the base model, under the base's name (None: the base)."""
            if adapter is None:
                return base_plan
            spec = load.plan(str(adapter), engine=engine, base_model=str(base_plan.model_dir))
            return replace(spec, name=base_plan.name)

        plan = promoted_plan(serving)
    where = plan.gguf or (f"{plan.model_dir} + {plan.adapter}" if plan.adapter else plan.model_dir)
    with console.status(f"loading {where} ({plan.engine})"):
        route, close = load.open_route(plan, **options)
        served = ServedModel(route.backend, name=name or plan.name, temperature=temperature, max_tokens=max_tokens)
    follower = None
    if record is not None:
        from flowrl.promote.follow import Follower  # lazy: keeps `flowrl --help` fast

        def load_promoted(adapter: Path | None) -> Any:
            return load.open_route(promoted_plan(adapter), **options)

        follower = Follower(served, record, load_promoted, serving=serving, close_current=close).start()
        close = follower.stop
    try:
        server, thread = start(served, host=host, port=port, api_key=api_key, allow_remote=allow_remote)
    except BaseException:
        close()
        raise
    if host not in LOCAL_HOSTS and api_key is None:
        err_console.print(f"[yellow]warning[/yellow]: listening on {host} without --api-key", highlight=False)
    console.print(f"serving {served.name} ({plan.engine}: {where}) at {server.url}; Ctrl-C stops", highlight=False)
    if record is not None:
        console.print(f"following {record.path}: the model promoted there serves as {served.name}", highlight=False)
    console.print(
        f"agent: use_served(agent, {server.url!r}, {served.name!r})  (LiteLLM: model='openai/{served.name}', "
        f"api_base={server.url!r}, api_key='none')",
        highlight=False,
    )
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
        close()
    if follower is not None and record is not None and follower.switches:
        console.print(f"switched models {len(follower.switches)} time(s) following {record.path}", highlight=False)
    counts = served.stats.counts
    console.print(
        f"served {counts['requests']} requests ({counts['tool calls']} tool calls parsed, "
        f"{counts['unparsed tool call']} replies with an unparsed tool call returned as text)",
        highlight=False,
    )
