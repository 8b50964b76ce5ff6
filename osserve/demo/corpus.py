"""The demo model's synthetic corpus: harmony conversations it is trained on and evaluated with.

Five skills, each a generator of `Example`s: two-digit addition, unit conversion, counting a
letter in a word, two function tools (get_weather, get_time) used when they are declared and
relevant, and a greeting. The assistant always reasons in `analysis` first; the reasoning effort
sets how long that is. Every answer is a fixed function of the prompt, so "exactly right" is
checkable.

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

from osserve.harmony.render import ChatMessage, Effort, FunctionTool, ToolCall, assistant_messages, render_chat
from osserve.tokenizer import load_tokenizer

Split = Literal["train", "heldout"]
EFFORTS: tuple[Effort, ...] = ("low", "medium", "high")

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


def tool_use(rng: random.Random, effort: Effort) -> list[Example]:
    """A question one declared tool answers: the call turn, then the answer turn with its result."""
    kind = rng.choice(("get_weather", "get_time"))
    tools = [TOOLS[kind]] if rng.random() < 0.5 else list(TOOLS.values())
    rng.shuffle(tools)
    city = rng.choice(CITIES)
    text = tool_question(rng, kind, city)
    user = [ChatMessage("user", text)]
    call = ToolCall(f"call_{rng.randrange(10**8)}", kind, json.dumps({"city": city}))
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


def missing_tool(rng: random.Random, effort: Effort) -> Example:
    """A weather or time question with no tool to answer it (or only the other tool)."""
    kind = rng.choice(("get_weather", "get_time"))
    other = "get_time" if kind == "get_weather" else "get_weather"
    tools = [] if rng.random() < 0.5 else [TOOLS[other]]
    text = tool_question(rng, kind, rng.choice(CITIES))
    reasoning = "The user asks for live information, but I have no tool for it."
    return Example("no_tool", [ChatMessage("user", text)], tools, effort, reasoning, NO_TOOL_ANSWER)


SKILLS = (  # (weight, generator): generators return one Example or a list
    (5, addition), (3, conversion), (4, letter_count), (1, greeting), (5, tool_use), (1, missing_tool),
)


def _one_draw(rng: random.Random) -> list[Example]:
    gen = rng.choices([g for _, g in SKILLS], weights=[w for w, _ in SKILLS])[0]
    effort = rng.choices(EFFORTS, weights=(1, 2, 1))[0]
    got = gen(rng, effort)
    if gen in (addition, conversion, letter_count, greeting) and rng.random() < 0.15:
        # Tools declared but irrelevant: the model must answer, not call one.
        for ex in got if isinstance(got, list) else [got]:
            ex.tools = list(TOOLS.values())[: rng.randrange(1, 3)]
    return got if isinstance(got, list) else [got]


def draw_examples(rng: random.Random, n: int, split: Split) -> list[Example]:
    """n examples of one split (greetings are too few to hold any out: they are in both)."""
    out: list[Example] = []
    while len(out) < n:
        for ex in _one_draw(rng):
            if ex.task == "greeting" or split_of(ex.user_text) == split:
                out.append(ex)
    return out[:n]


# ------------------------------------------------------------------ tokens
def completion_messages(ex: Example) -> list[Message]:
    """What the assistant writes, as the renderer renders such a turn in a later prompt."""
    calls = [ex.tool_call] if ex.tool_call is not None else []
    return assistant_messages(ChatMessage("assistant", ex.answer, reasoning=ex.reasoning, tool_calls=calls))


def tokenize(ex: Example) -> tuple[list[int], int]:
    """(prompt + completion token ids, prompt length): the prompt exactly as the server renders it,
    the completion as the model must write it (a final answer ends with <|return|>)."""
    enc = load_tokenizer().encoding
    prompt = render_chat(ex.messages, tools=ex.tools, reasoning_effort=ex.effort).token_ids
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
