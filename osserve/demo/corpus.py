"""The demo model's synthetic corpus: harmony conversations it is trained on and evaluated with.

Skills, each a generator of `Example`s: two-digit addition, unit conversion, counting a letter in a
word, two function tools (get_weather, get_time) used when they are declared and relevant, a
greeting, and (corpus 2) multiplication through the built-in `python` tool. The assistant always
reasons in `analysis` first; the reasoning effort sets how long that is. Every answer is a fixed
function of the prompt, so "exactly right" is checkable.

Two versions, by `CORPUS_VERSION` (a checkpoint's metadata says which it was trained on; the
shipped weights, without one, on corpus 1):
1. as above without python; additions reasoned by tens and ones ("Total: 180 + 18 = 198": the
   model got sums past 99 wrong, 99 + 99 = 188); every tool declared with the same words.
2. additions digit by digit with the carry, as written by hand ("Ones: 9 + 9 = 18: write 8, carry
   1. Tens: 9 + 9 + 1 = 19."); tools declared as users write them (other descriptions, `location`
   for `city`, with or without `required`: the corpus-1 model, shown `get_time` with a description
   of its user's, called it "the weather" or said it had no tool); multiplication through python
   when `code_interpreter` is declared (the call `print(a * b)` in analysis, the printed product
   used in the answer), and said to need it when not; python declared beside unrelated questions.

A prompt's user text decides its split: one in eight texts (by hash) is held out from training
and used only for evaluation, so the evaluation never sees a prompt the model was trained on.
Prompts and completions are rendered by the server's own renderer (harmony/render.py), so the
model learns exactly the token sequences it is served.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from openai_harmony import Message

from osserve.harmony.render import (
    ChatMessage,
    Effort,
    FunctionTool,
    ToolCall,
    ToolNamespaces,
    assistant_messages,
    render_chat,
)
from osserve.tokenizer import load_tokenizer
from osserve.tools.python.sandbox import SandboxLimits
from osserve.tools.python.tool import python_namespace

Split = Literal["train", "heldout"]
EFFORTS: tuple[Effort, ...] = ("low", "medium", "high")
CORPUS_VERSION = 2  # what training draws now (see the module docstring)

WEATHER_TOOL = FunctionTool(
    "get_weather", "Get the current weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
     "required": ["city"], "additionalProperties": False},
)
TIME_TOOL = FunctionTool(
    "get_time", "Get the current local time in a city.",
    {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
     "required": ["city"], "additionalProperties": False},
)
TOOLS = {t.name: t for t in (WEATHER_TOOL, TIME_TOOL)}

CITIES = (
    "Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Warsaw",
    "Oslo", "Stockholm", "Helsinki", "Dublin", "Athens", "Cairo", "Nairobi", "Lagos", "Mumbai", "Delhi",
    "Beijing", "Shanghai", "Seoul", "Bangkok", "Jakarta", "Sydney", "Melbourne", "Auckland", "Toronto",
    "Chicago", "Boston", "Seattle", "Denver", "Miami", "Mexico City", "Lima", "Santiago", "Bogota",
    "Buenos Aires", "Zurich",
)
CONDITIONS = ("sunny", "cloudy", "rainy", "snowy", "windy", "foggy", "stormy", "clear")
WORDS = (
    "apple", "banana", "cherry", "orange", "lemon", "mango", "grape", "melon", "peach", "pear",
    "strawberry", "raspberry", "blueberry", "coconut", "pineapple", "tomato", "potato", "carrot",
    "onion", "pepper", "garlic", "butter", "bread", "cheese", "coffee", "cookie", "pizza", "pasta",
    "rice", "sugar", "water", "river", "mountain", "forest", "desert", "island", "ocean", "planet",
    "rocket", "engine", "bottle", "window", "garden", "kitchen", "letter", "pencil", "paper",
    "school", "teacher", "student", "doctor", "banana", "yellow", "purple", "green", "silver",
    "golden", "little", "happy", "summer", "winter", "spring", "autumn", "morning", "evening",
    "mirror", "button", "rabbit", "turtle", "monkey", "tiger", "zebra", "giraffe", "elephant",
    "dolphin", "penguin", "parrot", "kitten", "puppy", "dragon", "castle", "bridge", "street",
    "market", "library", "balloon", "hammer", "ladder", "pillow", "blanket", "jacket", "pocket",
    "rainbow", "thunder", "coffee", "football", "basketball", "guitar", "piano", "violin", "trumpet",
    "computer", "keyboard", "internet", "network", "server", "python", "banana", "cinnamon",
    "mississippi", "committee", "bookkeeper", "balloon", "occurrence", "assessment",
)
UNITS = (  # (from, to, factor)
    ("km", "m", 1000), ("m", "cm", 100), ("kg", "g", 1000), ("hours", "minutes", 60),
    ("minutes", "seconds", 60), ("days", "hours", 24), ("feet", "inches", 12), ("weeks", "days", 7),
    ("liters", "milliliters", 1000), ("dollars", "cents", 100),
)
GREETINGS = ("Hello!", "Hi", "Hello", "Hi there!", "Hey", "Who are you?", "What can you do?", "Good morning!")
INTRO = ("Hello! I am a tiny demo model served by osserve. I can add numbers, convert units, count "
         "letters in a word, and check the weather or the time with a tool.")
NO_TOOL_ANSWER = "I cannot check that without a tool for it."


@dataclass
class Example:
    """One assistant turn: the request as a client sends it, and what the assistant writes."""

    task: str
    messages: list[ChatMessage]
    tools: list[FunctionTool]
    effort: Effort
    reasoning: str
    answer: str | None = None  # the final answer; None when this turn is a tool call
    tool_call: ToolCall | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what an evaluation needs (city, kind)
    python: bool = False  # the built-in python tool is declared (the Responses API's code_interpreter)

    @property
    def user_text(self) -> str:
        return next(m.content or "" for m in self.messages if m.role == "user")


def split_of(user_text: str) -> Split:
    return "heldout" if hashlib.sha256(user_text.encode()).digest()[0] % 8 == 0 else "train"


def _reason(effort: Effort, low: str, medium: str, high: str) -> str:
    return {"low": low, "medium": medium, "high": high}[effort]


# ------------------------------------------------------------------ skills
def addition(rng: random.Random, effort: Effort) -> Example:
    a, b = rng.randrange(100), rng.randrange(100)
    s = a + b
    text = rng.choice(("What is {a} + {b}?", "Compute {a} plus {b}.", "Add {a} and {b}.", "{a} + {b} = ?",
                       "What is the sum of {a} and {b}?")).format(a=a, b=b)
    ta, tb, oa, ob = a // 10 * 10, b // 10 * 10, a % 10, b % 10
    steps = f"Tens: {ta} + {tb} = {ta + tb}. Ones: {oa} + {ob} = {oa + ob}. Total: {ta + tb} + {oa + ob} = {s}."
    reasoning = _reason(effort, steps, f"Add {a} and {b}. {steps}", f"Add {a} and {b}. {steps} Check: {b} + {a} = {s}.")
    return Example("addition", [ChatMessage("user", text)], [], effort, reasoning, f"{a} + {b} = {s}.")


def addition_by_digits(rng: random.Random, effort: Effort) -> Example:
    """Corpus 2's addition: the ones, then the tens with the carry, as written by hand."""
    a, b = rng.randrange(100), rng.randrange(100)
    s = a + b
    text = rng.choice(("What is {a} + {b}?", "Compute {a} plus {b}.", "Add {a} and {b}.", "{a} + {b} = ?",
                       "What is the sum of {a} and {b}?")).format(a=a, b=b)
    ones = a % 10 + b % 10
    carry = ones // 10
    tens = a // 10 + b // 10 + carry
    steps = (f"Ones: {a % 10} + {b % 10} = {ones}: write {ones % 10}, carry {carry}. "
             f"Tens: {a // 10} + {b // 10} + {carry} = {tens}. Total: {s}.")
    reasoning = _reason(effort, steps, f"Add {a} and {b}. {steps}", f"Add {a} and {b}. {steps} Check: {b} + {a} = {s}.")
    return Example("addition", [ChatMessage("user", text)], [], effort, reasoning, f"{a} + {b} = {s}.")


def conversion(rng: random.Random, effort: Effort) -> Example:
    src, dst, factor = rng.choice(UNITS)
    n = rng.randrange(1, 51)
    text = rng.choice(("Convert {n} {src} to {dst}.", "How many {dst} are in {n} {src}?",
                       "{n} {src} in {dst}?")).format(n=n, src=src, dst=dst)
    one = "foot" if src == "feet" else src.rstrip("s")
    fact = f"1 {one} is {factor} {dst}"
    steps = f"{n} × {factor} = {n * factor}."
    reasoning = _reason(effort, steps, f"{fact}. {steps}", f"{fact}. {steps} So {n} {src} is {n * factor} {dst}.")
    return Example("conversion", [ChatMessage("user", text)], [], effort, reasoning, f"{n} {src} = {n * factor} {dst}.")


def letter_count(rng: random.Random, effort: Effort) -> Example:
    word = rng.choice(WORDS)
    letter = rng.choice(word) if rng.random() < 0.75 else rng.choice("abcdefghijklmnopqrstuvwxyz")
    text = rng.choice(('How many times does the letter "{c}" appear in "{w}"?', 'Count the letter "{c}" in "{w}".',
                       'How many "{c}" are in the word "{w}"?')).format(c=letter, w=word)
    count, running = 0, []
    for ch in word:
        count += ch == letter
        running.append(f"{ch} {count}")
    steps = f'Spell "{word}" and count "{letter}": {", ".join(running)}. Total: {count}.'
    reasoning = _reason(effort, steps, steps, f"{steps} The word has {len(word)} letters.")
    return Example("letter_count", [ChatMessage("user", text)], [], effort, reasoning,
                   f'"{word}" has {count} of the letter "{letter}".')


def greeting(rng: random.Random, effort: Effort) -> Example:
    text = rng.choice(GREETINGS)
    reasoning = "The user greets me or asks what I can do. I will introduce myself."
    return Example("greeting", [ChatMessage("user", text)], [], effort, reasoning, INTRO)


def weather_result(city: str, rng: random.Random) -> dict[str, Any]:
    return {"city": city, "temperature_c": rng.randrange(-10, 41), "condition": rng.choice(CONDITIONS)}


def time_result(city: str, rng: random.Random) -> dict[str, Any]:
    return {"city": city, "time": f"{rng.randrange(24):02d}:{rng.randrange(60):02d}"}


def tool_question(rng: random.Random, kind: str, city: str) -> str:
    forms: tuple[str, ...]
    if kind == "get_weather":
        forms = ("What is the weather in {c}?", "How is the weather in {c} today?", "Is it sunny in {c}?",
                 "What's the weather like in {c} right now?", "Tell me the weather in {c}.")
    else:
        forms = ("What time is it in {c}?", "What is the local time in {c}?", "Tell me the time in {c}.",
                 "What's the time in {c} right now?")
    return rng.choice(forms).format(c=city)


def tool_answer(kind: str, result: dict[str, Any]) -> tuple[str, str]:
    """(reasoning, final answer) once the tool's result is in."""
    c = result["city"]
    if kind == "get_weather":
        t, cond = result["temperature_c"], result["condition"]
        return f"The tool says {c} is {t}°C and {cond}.", f"It is {t}°C and {cond} in {c}."
    return f"The tool says it is {result['time']} in {c}.", f"It is {result['time']} in {c}."


DESCRIPTIONS = {
    "get_weather": ("Get the current weather in a city.", "Get the current weather in a given city", "",
                    "Returns the weather for a location.", "Look up today's weather.", "Current weather conditions"),
    "get_time": ("Get the current local time in a city.", "Get the current time in a given city", "",
                 "Returns the local time for a location.", "Look up the time of day somewhere.", "Current time"),
}
PARAMETER_NOTES = ("The city name", "City name", "A city, e.g. Paris", "")


def declared_tool(rng: random.Random, kind: str, varied: bool) -> FunctionTool:
    """A tool as a client declares it: corpus 1's fixed words, or (varied) one of the ways users
    write it, half the time the fixed one."""
    if not varied or rng.random() < 0.5:
        return TOOLS[kind]
    name = rng.choice(("city", "city", "location"))
    note = rng.choice(PARAMETER_NOTES)
    schema: dict[str, Any] = {"type": "object", "properties": {name: {"type": "string", **({"description": note}
                                                                                          if note else {})}}}
    if rng.random() < 0.7:
        schema["required"] = [name]
    if rng.random() < 0.3:
        schema["additionalProperties"] = False
    return FunctionTool(kind, rng.choice(DESCRIPTIONS[kind]), schema)


def city_argument(tool: FunctionTool) -> str:
    """The declared tool's parameter that names the city."""
    return next(iter((tool.parameters or {}).get("properties", {})), "city")


def tool_use(rng: random.Random, effort: Effort, varied: bool = False) -> list[Example]:
    """A question one declared tool answers: the call turn, then the answer turn with its result."""
    kind = rng.choice(("get_weather", "get_time"))
    other = "get_time" if kind == "get_weather" else "get_weather"
    tool = declared_tool(rng, kind, varied)
    both = [tool, declared_tool(rng, other, varied)] if varied else list(TOOLS.values())
    tools = [tool] if rng.random() < 0.5 else both
    rng.shuffle(tools)
    city = rng.choice(CITIES)
    text = tool_question(rng, kind, city)
    user = [ChatMessage("user", text)]
    call = ToolCall(f"call_{rng.randrange(10**8)}", kind, json.dumps({city_argument(tool): city}))
    what = "weather" if kind == "get_weather" else "local time"
    reasoning = _reason(effort, f"Call {kind} for {city}.",
                        f"The user asks for the {what} in {city}. I will call {kind}.",
                        f"The user asks for the {what} in {city}. I have the {kind} tool, so I will call it.")
    first = Example("tool_call", user, tools, effort, reasoning, tool_call=call, extra={"kind": kind, "city": city})
    result = (weather_result if kind == "get_weather" else time_result)(city, rng)
    # Clients send the call back with or without its reasoning (Chat clients drop it; the
    # Responses API's previous_response_id keeps it): train on both.
    sent_back = ChatMessage("assistant", None, reasoning=reasoning if rng.random() < 0.5 else None, tool_calls=[call])
    history = user + [sent_back, ChatMessage("tool", json.dumps(result), tool_call_id=call.id)]
    why, answer = tool_answer(kind, result)
    second = Example("tool_answer", history, tools, effort, why, answer, extra={"kind": kind, "city": city})
    return [first, second]


def missing_tool(rng: random.Random, effort: Effort, varied: bool = False) -> Example:
    """A weather or time question with no tool to answer it (or only the other tool)."""
    kind = rng.choice(("get_weather", "get_time"))
    other = "get_time" if kind == "get_weather" else "get_weather"
    tools = [] if rng.random() < 0.5 else [declared_tool(rng, other, varied)]
    text = tool_question(rng, kind, rng.choice(CITIES))
    reasoning = "The user asks for live information, but I have no tool for it."
    return Example("no_tool", [ChatMessage("user", text)], tools, effort, reasoning, NO_TOOL_ANSWER)


def multiplication(rng: random.Random, effort: Effort) -> list[Example]:
    """Corpus 2: a product of two numbers (11-999): with python declared, the call, then the answer
    turn with what it printed; without, the model says it needs python (it cannot multiply)."""
    a, b = rng.randrange(11, 1000), rng.randrange(11, 1000)
    text = rng.choice(("What is {a} * {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.", "{a} * {b} = ?",
                       "Compute {a} × {b}.", "What is the product of {a} and {b}?")).format(a=a, b=b)
    user = [ChatMessage("user", text)]
    extra = {"a": a, "b": b}
    if rng.random() < 0.15:
        reasoning = f"Multiplying {a} by {b} needs python, and I have no python tool here."
        return [Example("no_python", user, [], effort, reasoning, PYTHON_NEEDED, extra=extra)]
    reasoning = _reason(effort, f"Multiply {a} by {b} in python.", f"Multiply {a} by {b}. I will use python.",
                        f"Multiply {a} by {b}. That is too long to do in my head, so I will run it in python.")
    call = ToolCall(f"ci_{rng.randrange(10**8)}", "python", f"print({a} * {b})", recipient="python",
                    channel="analysis")
    first = Example("python_call", user, [], effort, reasoning, tool_call=call, extra=extra, python=True)
    history = user + [ChatMessage("assistant", None, reasoning=reasoning, tool_calls=[call]),
                      ChatMessage("tool", f"{a * b}\n", tool_call_id=call.id)]
    second = Example("python_answer", history, [], effort, f"python printed {a * b}.", f"{a} * {b} = {a * b}.",
                     extra=extra, python=True)
    return [first, second]


PYTHON_NEEDED = "I need the python tool to multiply numbers this large."


def _tool_use_varied(rng: random.Random, effort: Effort) -> list[Example]:
    return tool_use(rng, effort, varied=True)


def _missing_tool_varied(rng: random.Random, effort: Effort) -> Example:
    return missing_tool(rng, effort, varied=True)


SKILLS_BY_VERSION: dict[int, tuple[tuple[int, Any], ...]] = {  # (weight, generator): one Example or a list
    1: ((5, addition), (3, conversion), (4, letter_count), (1, greeting), (5, tool_use), (1, missing_tool)),
    2: ((6, addition_by_digits), (3, conversion), (4, letter_count), (1, greeting), (6, _tool_use_varied),
        (1, _missing_tool_varied), (4, multiplication)),
}
ANSWERED_DIRECTLY = (addition, addition_by_digits, conversion, letter_count, greeting)


def _one_draw(rng: random.Random, version: int) -> list[Example]:
    skills = SKILLS_BY_VERSION[version]
    gen = rng.choices([g for _, g in skills], weights=[w for w, _ in skills])[0]
    effort = rng.choices(EFFORTS, weights=(1, 2, 1))[0]
    got = gen(rng, effort)
    examples = got if isinstance(got, list) else [got]
    if gen in ANSWERED_DIRECTLY and rng.random() < 0.15:
        # Tools declared but irrelevant: the model must answer, not call one.
        for ex in examples:
            ex.tools = list(TOOLS.values())[: rng.randrange(1, 3)]
    if version >= 2 and gen is not multiplication and rng.random() < 0.1:
        for ex in examples:  # python declared, for another question: answered as without it
            ex.python = True
    return examples


def draw_examples(rng: random.Random, n: int, split: Split, version: int = CORPUS_VERSION) -> list[Example]:
    """n examples of one split (greetings are too few to hold any out: they are in both)."""
    out: list[Example] = []
    while len(out) < n:
        for ex in _one_draw(rng, version):
            if ex.task == "greeting" or split_of(ex.user_text) == split:
                out.append(ex)
    return out[:n]


# ------------------------------------------------------------------ tokens
def completion_messages(ex: Example) -> list[Message]:
    """What the assistant writes, as the renderer renders such a turn in a later prompt."""
    calls = [ex.tool_call] if ex.tool_call is not None else []
    return assistant_messages(ChatMessage("assistant", ex.answer, reasoning=ex.reasoning, tool_calls=calls))


def namespaces(ex: Example) -> ToolNamespaces | None:
    """The built-in tools the example's prompt declares, as the server shows them."""
    return ToolNamespaces(builtin=[python_namespace(SandboxLimits())]) if ex.python else None


def tokenize(ex: Example) -> tuple[list[int], int]:
    """(prompt + completion token ids, prompt length): the prompt exactly as the server renders it,
    the completion as the model must write it (a final answer ends with <|return|>)."""
    enc = load_tokenizer().encoding
    prompt = render_chat(ex.messages, tools=ex.tools, reasoning_effort=ex.effort, namespaces=namespaces(ex)).token_ids
    start_assistant = prompt[-2:]  # the prompt ends with <|start|>assistant
    completion: list[int] = []
    for i, m in enumerate(completion_messages(ex)):
        ids = enc.render(m)  # type: ignore[attr-defined]
        if i == 0:
            assert ids[:2] == start_assistant, "harmony rendered the assistant header differently"
            ids = ids[2:]
        completion.extend(ids)
    if ex.tool_call is None:
        completion[-1] = enc.encode("<|return|>", allowed_special="all")[0]  # type: ignore[attr-defined]
    return prompt + completion, len(prompt)
