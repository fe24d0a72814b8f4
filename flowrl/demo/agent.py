"""An example agent that behaves like a toolboxv2 FlowAgent, driven by a local model.

It has FlowAgent's shape, so `hook_into_agent` captures it the same way: `a_run(query, session_id,
get_ctx=...)` never raises, an execution engine (`_get_execution_engine()`) runs a ReAct loop that
calls `a_run_llm_completion(..., get_response_message=True)` and `_execute_tool_call(ctx, tool_call)`,
which handles `final_answer` itself and sends every other tool to `arun_function(name, **kwargs)`.
The transcript lives in `ExecutionContext.working_history` in OpenAI format.

Tools: `exec_code` (a Python calculator, run in flowrl's sandbox), `lookup` (a small fact table),
`get_weather` (fails about one call in three), and `final_answer(answer, success)`.

The model writes tool calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; text
without a tool call is taken as the final answer. Its outputs are real model output: good and bad
traces come from the model, not from a script.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol

from flowrl.engines.chat_backend import Completion  # the reply type every backend returns

# The tables behind `lookup`. The generated task suite (flowrl/demo/suite.py) asks about their entries, so every
# value here is an answer some task is graded on: countries whose capital is disputed or spelled several ways
# are left out, names are lower-case ASCII.
CAPITALS: dict[str, str] = dict(
    item.strip().split("=")
    for item in """
afghanistan=Kabul; albania=Tirana; algeria=Algiers; andorra=Andorra la Vella; angola=Luanda; argentina=Buenos Aires;
armenia=Yerevan; australia=Canberra; austria=Vienna; azerbaijan=Baku; bahamas=Nassau; bahrain=Manama;
bangladesh=Dhaka; barbados=Bridgetown; belarus=Minsk; belgium=Brussels; belize=Belmopan; bhutan=Thimphu;
bosnia and herzegovina=Sarajevo; botswana=Gaborone; brazil=Brasilia; brunei=Bandar Seri Begawan; bulgaria=Sofia;
burkina faso=Ouagadougou; cambodia=Phnom Penh; cameroon=Yaounde; canada=Ottawa; cape verde=Praia;
central african republic=Bangui; chile=Santiago; china=Beijing; colombia=Bogota; comoros=Moroni; costa rica=San Jose;
croatia=Zagreb; cuba=Havana; cyprus=Nicosia; czech republic=Prague; denmark=Copenhagen; dominica=Roseau;
dominican republic=Santo Domingo; east timor=Dili; ecuador=Quito; egypt=Cairo; el salvador=San Salvador;
eritrea=Asmara; estonia=Tallinn; ethiopia=Addis Ababa; fiji=Suva; finland=Helsinki; france=Paris; gabon=Libreville;
gambia=Banjul; georgia=Tbilisi; germany=Berlin; ghana=Accra; greece=Athens; guatemala=Guatemala City;
guinea=Conakry; guinea-bissau=Bissau; guyana=Georgetown; haiti=Port-au-Prince; honduras=Tegucigalpa;
hungary=Budapest; iceland=Reykjavik; india=New Delhi; iran=Tehran; iraq=Baghdad; ireland=Dublin; italy=Rome;
jamaica=Kingston; japan=Tokyo; jordan=Amman; kenya=Nairobi; kuwait=Kuwait City; kyrgyzstan=Bishkek; laos=Vientiane;
latvia=Riga; lebanon=Beirut; lesotho=Maseru; liberia=Monrovia; libya=Tripoli; liechtenstein=Vaduz;
lithuania=Vilnius; madagascar=Antananarivo; malawi=Lilongwe; malaysia=Kuala Lumpur; mali=Bamako; malta=Valletta;
marshall islands=Majuro; mauritania=Nouakchott; mauritius=Port Louis; mexico=Mexico City; micronesia=Palikir;
moldova=Chisinau; mongolia=Ulaanbaatar; montenegro=Podgorica; morocco=Rabat; mozambique=Maputo; namibia=Windhoek;
nepal=Kathmandu; netherlands=Amsterdam; new zealand=Wellington; nicaragua=Managua; niger=Niamey; nigeria=Abuja;
north korea=Pyongyang; north macedonia=Skopje; norway=Oslo; oman=Muscat; pakistan=Islamabad; panama=Panama City;
papua new guinea=Port Moresby; paraguay=Asuncion; peru=Lima; philippines=Manila; poland=Warsaw; portugal=Lisbon;
qatar=Doha; romania=Bucharest; russia=Moscow; rwanda=Kigali; saint lucia=Castries; samoa=Apia;
saudi arabia=Riyadh; senegal=Dakar; serbia=Belgrade; seychelles=Victoria; sierra leone=Freetown;
slovakia=Bratislava; slovenia=Ljubljana; solomon islands=Honiara; somalia=Mogadishu; south korea=Seoul;
south sudan=Juba; spain=Madrid; sudan=Khartoum; suriname=Paramaribo; sweden=Stockholm; switzerland=Bern;
syria=Damascus; tajikistan=Dushanbe; thailand=Bangkok; togo=Lome; trinidad and tobago=Port of Spain; tunisia=Tunis;
turkey=Ankara; turkmenistan=Ashgabat; tuvalu=Funafuti; uganda=Kampala; ukraine=Kyiv; united arab emirates=Abu Dhabi;
united kingdom=London; united states=Washington; uruguay=Montevideo; uzbekistan=Tashkent; vanuatu=Port Vila;
venezuela=Caracas; vietnam=Hanoi; zambia=Lusaka; zimbabwe=Harare""".split(";")
)
# name -> (atomic number, symbol), elements 1 to 103 in order
ELEMENTS: dict[str, tuple[int, str]] = {
    name: (number, symbol)
    for number, (symbol, name) in enumerate(
        (
            item.split()
            for item in """
H hydrogen; He helium; Li lithium; Be beryllium; B boron; C carbon; N nitrogen; O oxygen; F fluorine; Ne neon;
Na sodium; Mg magnesium; Al aluminium; Si silicon; P phosphorus; S sulfur; Cl chlorine; Ar argon; K potassium;
Ca calcium; Sc scandium; Ti titanium; V vanadium; Cr chromium; Mn manganese; Fe iron; Co cobalt; Ni nickel;
Cu copper; Zn zinc; Ga gallium; Ge germanium; As arsenic; Se selenium; Br bromine; Kr krypton; Rb rubidium;
Sr strontium; Y yttrium; Zr zirconium; Nb niobium; Mo molybdenum; Tc technetium; Ru ruthenium; Rh rhodium;
Pd palladium; Ag silver; Cd cadmium; In indium; Sn tin; Sb antimony; Te tellurium; I iodine; Xe xenon; Cs caesium;
Ba barium; La lanthanum; Ce cerium; Pr praseodymium; Nd neodymium; Pm promethium; Sm samarium; Eu europium;
Gd gadolinium; Tb terbium; Dy dysprosium; Ho holmium; Er erbium; Tm thulium; Yb ytterbium; Lu lutetium;
Hf hafnium; Ta tantalum; W tungsten; Re rhenium; Os osmium; Ir iridium; Pt platinum; Au gold; Hg mercury;
Tl thallium; Pb lead; Bi bismuth; Po polonium; At astatine; Rn radon; Fr francium; Ra radium; Ac actinium;
Th thorium; Pa protactinium; U uranium; Np neptunium; Pu plutonium; Am americium; Cm curium; Bk berkelium;
Cf californium; Es einsteinium; Fm fermium; Md mendelevium; No nobelium; Lr lawrencium""".split(";")
        ),
        start=1,
    )
}
# whole-number facts, phrased so that "number of <key>" reads as a question
COUNTS: dict[str, int] = {
    "days in a week": 7,
    "days in a fortnight": 14,
    "days in a year": 365,
    "days in a leap year": 366,
    "hours in a day": 24,
    "hours in a week": 168,
    "minutes in an hour": 60,
    "minutes in a day": 1440,
    "seconds in a minute": 60,
    "seconds in an hour": 3600,
    "seconds in a day": 86400,
    "weeks in a year": 52,
    "months in a year": 12,
    "years in a decade": 10,
    "years in a century": 100,
    "years in a millennium": 1000,
    "grams in a kilogram": 1000,
    "kilograms in a tonne": 1000,
    "milliliters in a liter": 1000,
    "meters in a kilometer": 1000,
    "centimeters in a meter": 100,
    "millimeters in a centimeter": 10,
    "inches in a foot": 12,
    "feet in a yard": 3,
    "feet in a mile": 5280,
    "yards in a mile": 1760,
    "ounces in a pound": 16,
    "pounds in a stone": 14,
    "quarts in a gallon": 4,
    "bits in a byte": 8,
    "degrees in a circle": 360,
    "degrees in a right angle": 90,
    "sides of a pentagon": 5,
    "sides of a hexagon": 6,
    "sides of an octagon": 8,
    "squares on a chessboard": 64,
    "keys on a piano": 88,
    "cards in a standard deck": 52,
    "players on a soccer team": 11,
    "strings on a violin": 4,
    "bones in the adult human body": 206,
    "legs of a spider": 8,
    "legs of an insect": 6,
    "hearts of an octopus": 3,
    "states in the united states": 50,
    "planets in the solar system": 8,
    "continents on earth": 7,
}
FACTS: dict[str, str] = {
    "capital of france": "Paris",
    "capital of japan": "Tokyo",
    "capital of italy": "Rome",
    "boiling point of water": "100 degrees Celsius",
    "days in a week": "7",
    "speed of light": "299792458 m/s",
    **{f"capital of {country}": city for country, city in CAPITALS.items()},
    **{f"atomic number of {name}": str(number) for name, (number, _) in ELEMENTS.items()},
    **{f"chemical symbol of {name}": symbol for name, (_, symbol) in ELEMENTS.items()},
    **{key: str(value) for key, value in COUNTS.items()},
}
WEATHER = {"berlin": "sunny, 21C", "rome": "cloudy, 18C", "paris": "rainy, 15C"}

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "exec_code",
            "description": "Run Python code and return what it prints.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact, e.g. 'capital of france'.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "final_answer",
            "description": "Give the final answer to the user.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string"}, "success": {"type": "boolean"}},
                "required": ["answer"],
            },
        },
    },
]

SYSTEM_PROMPT = (
    "You are a helpful assistant with tools. Tools:\n"
    + "\n".join(
        f"- {t['function']['name']}: {t['function']['description']} "
        f"arguments: {json.dumps(list(t['function']['parameters']['properties']))}"
        for t in TOOLS
    )
    + "\nTo use a tool, reply with exactly one line: "
    '<tool_call>{"name": "exec_code", "arguments": {"code": "print(2 + 2)"}}</tool_call>\n'
    'When you know the answer, reply: <tool_call>{"name": "final_answer", "arguments": {"answer": "4"}}</tool_call>'
)

# One worked example before the user's turn: small models copy its shape.
FEW_SHOT: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 2 + 3?"},
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "exec_code", "arguments": {"code": "print(2 + 3)"}}</tool_call>',
    },
    {"role": "user", "content": "[exec_code result] 5"},
    {"role": "assistant", "content": '<tool_call>{"name": "final_answer", "arguments": {"answer": "5"}}</tool_call>'},
]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


class ChatBackend(Protocol):
    model_name: str

    def complete(self, messages: list[dict[str, Any]]) -> Completion | tuple[str, int, int]:
        """Return a `Completion`, or (text, prompt tokens, completion tokens)."""


@dataclass
class _ToolFunction:
    name: str
    arguments: str


@dataclass
class _ToolCall:
    id: str
    function: _ToolFunction
    type: str = "function"


@dataclass
class _AssistantMessage:
    content: str | None
    tool_calls: list[_ToolCall] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokenizer: str | None = None


@dataclass
class ExecutionContext:
    run_id: str
    session_id: str
    query: str
    status: str = "running"
    working_history: list[dict[str, Any]] = field(default_factory=list)
    current_iteration: int = 0
    max_iterations: int = 4
    tools_dict: list[dict[str, Any]] = field(default_factory=list)


def find_fact(key: str, facts: dict[str, str] = FACTS) -> str | None:
    """The `lookup` tool's matching. The key is lower-cased and stripped of ' ?.'; then the fact named exactly,
    else the longest fact named inside the key ("capital of nigeria" is not "capital of niger"), else the first
    fact whose name contains the key as whole words ("capital of mars" is not "capital of marshall islands").
    None when nothing matches."""
    key = key.lower().strip(" ?.")
    if not key:
        return None
    if key in facts:
        return facts[key]
    inside = [fact for fact in facts if fact in key]
    if inside:
        return facts[max(inside, key=len)]
    words = re.compile(rf"(?<!\w){re.escape(key)}(?!\w)")
    return next((value for fact, value in facts.items() if words.search(fact)), None)


def parse_tool_calls(text: str) -> list[_ToolCall]:
    calls = []
    for raw in _TOOL_CALL.findall(text or ""):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            calls.append(_ToolCall(f"call_{uuid.uuid4().hex[:8]}", _ToolFunction("invalid_tool_call", raw)))
            continue
        if isinstance(data, list):
            data = data[0] if data else {}
        if not isinstance(data, dict):
            continue
        args = data.get("arguments", {})
        calls.append(
            _ToolCall(
                f"call_{uuid.uuid4().hex[:8]}",
                _ToolFunction(str(data.get("name", "")), args if isinstance(args, str) else json.dumps(args)),
            )
        )
    return calls


class ExampleEngine:
    def __init__(self, agent: ExampleAgent) -> None:
        self.agent = agent
        self._active_executions: dict[str, ExecutionContext] = {}
        self._session_last_run: dict[str, str] = {}

    async def execute(self, query: str, session_id: str, max_iterations: int) -> tuple[str, ExecutionContext]:
        ctx = ExecutionContext(uuid.uuid4().hex[:8], session_id, query, max_iterations=max_iterations)
        ctx.working_history = [
            {"role": "system", "content": SYSTEM_PROMPT},
            *FEW_SHOT,
            {"role": "user", "content": query},
        ]
        self._active_executions[ctx.run_id] = ctx
        self._session_last_run[session_id] = ctx.run_id
        answer = ""
        for _ in range(max_iterations):
            ctx.current_iteration += 1
            msg = await self.agent.a_run_llm_completion(
                messages=list(ctx.working_history), tools=TOOLS, get_response_message=True, with_context=False
            )
            ctx.working_history.append(
                {
                    "role": "assistant",
                    "content": msg.content,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments},
                        }
                        for c in msg.tool_calls
                    ]
                    or None,
                }
            )
            if not ctx.working_history[-1]["tool_calls"]:
                ctx.working_history[-1].pop("tool_calls")
                answer, ctx.status = (msg.content or "").strip(), "completed"
                return answer, ctx
            for call in msg.tool_calls:
                result, is_final = await self._execute_tool_call(ctx, call)
                if is_final:
                    ctx.status = "completed"
                    return result, ctx
        ctx.status = "max_iterations"
        return answer or "I could not finish the task.", ctx

    async def _execute_tool_call(self, ctx: ExecutionContext, tool_call: _ToolCall) -> tuple[str, bool]:
        name = tool_call.function.name
        try:
            args = json.loads(tool_call.function.arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be an object")
        except (json.JSONDecodeError, ValueError):
            result = "System-Error: Invalid JSON in tool arguments"
            ctx.working_history.append({"role": "tool", "tool_call_id": tool_call.id, "name": name, "content": result})
            return result, False
        if name == "final_answer":
            ctx.final_success = bool(args.get("success", True))  # type: ignore[attr-defined]
            return str(args.get("answer", "")), True
        try:
            result = str(await self.agent.arun_function(name, **args))
        except Exception as exc:
            result = f"Error executing {name}: {exc}"
        ctx.working_history.append({"role": "tool", "tool_call_id": tool_call.id, "name": name, "content": result})
        ctx.tools_dict.append({"name": name, "args": args, "result": result})
        return result, False


class ExampleAgent:
    """A FlowAgent look-alike. `backend` produces the model's text; `sandbox` runs `exec_code`."""

    def __init__(
        self, backend: ChatBackend, *, name: str = "example_agent", sandbox: Any = None, seed: int = 0
    ) -> None:
        self.amd = SimpleNamespace(name=name, fast_llm_model=backend.model_name, complex_llm_model=backend.model_name)
        self.backend = backend
        self.sandbox = sandbox
        self._rng = random.Random(seed)
        self._execution_engine_cache: ExampleEngine | None = None
        self.total_tokens_in = self.total_tokens_out = self.total_llm_calls = 0

    def _get_execution_engine(self) -> ExampleEngine:
        if self._execution_engine_cache is None:
            self._execution_engine_cache = ExampleEngine(self)
        return self._execution_engine_cache

    async def a_run(
        self,
        query: str,
        session_id: str = "default",
        execution_id: str | None = None,
        max_iterations: int = 4,
        get_ctx: bool = False,
        **kwargs: Any,
    ) -> Any:
        ctx = None
        try:
            answer, ctx = await self._get_execution_engine().execute(query, session_id, max_iterations)
        except Exception as exc:  # FlowAgent's a_run never raises
            answer = f"Error: {exc}"
        return (answer, ctx) if get_ctx else answer

    async def a_run_llm_completion(
        self, messages: list[dict[str, Any]], tools: Any = None, get_response_message: bool = False, **kwargs: Any
    ) -> Any:
        reply = await asyncio.to_thread(self.backend.complete, messages)
        if not isinstance(reply, Completion):
            reply = Completion(*reply)
        text = reply.text
        self.total_tokens_in += reply.prompt_tokens
        self.total_tokens_out += reply.completion_tokens
        self.total_llm_calls += 1
        if not get_response_message:
            return text
        calls = parse_tool_calls(text)
        content = _TOOL_CALL.sub("", text).strip() or None
        return _AssistantMessage(
            content if not calls else (content or None),
            calls,
            reply.prompt_token_ids,
            reply.token_ids,
            reply.logprobs,
            reply.tokenizer,
        )

    async def arun_function(self, function_name: str, **kwargs: Any) -> Any:
        if function_name == "exec_code":
            return await asyncio.to_thread(self._exec_code, str(kwargs.get("code", "")))
        if function_name == "lookup":
            value = find_fact(str(kwargs.get("key", "")))
            if value is None:
                raise KeyError(f"no fact for {kwargs.get('key')!r}")
            return value
        if function_name == "get_weather":
            if self._rng.random() < 0.34:
                raise TimeoutError("weather service unreachable")
            city = str(kwargs.get("city", "")).lower()
            if city not in WEATHER:
                raise KeyError(f"unknown city {kwargs.get('city')!r}")
            return WEATHER[city]
        raise KeyError(f"unknown tool {function_name!r}")

    def _exec_code(self, code: str) -> dict[str, Any]:
        if self.sandbox is None:
            raise RuntimeError("exec_code needs a sandbox")
        res = self.sandbox.run(code, "python", timeout=5.0)
        return {
            "success": res.status == "ok",
            "output": (res.stdout or "").strip()[:500],
            "error": (res.stderr or "").strip()[-500:] or None,
        }
