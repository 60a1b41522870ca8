"""`parse_choice` over real-model-style replies: the phrasings models use, ambiguous ones
refused, the article "a" never read as option A; plus the replies SmolLM2-135M-Instruct
gave through llama.cpp (tests/llm/data/smollm2_replies.json, kept verbatim from the
``real_model`` runs, each with the letter a reader takes from it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vtrm_gate.llm import parse_choice
from vtrm_gate.llm._replies import answer_argument, is_context_overflow, is_prompt_filtered

DATA = Path(__file__).parent / "data" / "smollm2_replies.json"

TABLE: list[tuple[str, str | None]] = [
    # bare labels
    ("B", "B"), ("(C)", "C"), ("b.", "B"), ("a", "A"), ("(a)", "A"), ("**B**", "B"),
    ("D)", "D"), ("[C]", "C"), ("  C  ", "C"), ("C.", "C"),
    # a label and the option's text, or an explanation below
    ("A) a cat", "A"), ("A. green", "A"), ("B. a dog running across the field", "B"),
    ("B\n\nExplanation: the dog runs across the whole field.", "B"),
    ("**C) a bird**", "C"), ("C: the bird", "C"),
    # statements of the answer
    ("The answer is (B).", "B"), ("Answer: C", "C"), ("answer is b", "B"),
    ("Answer: (c)", "C"), ("**Answer:** D", "D"), ("The correct option is B.", "B"),
    ("I would choose C.", "C"), ("I'd go with option A.", "A"),
    ("The answer is a bit tricky, but I think it is C.", "C"),
    ("Final answer: (B)", "B"), ("So the answer must be D.", "D"),
    ("The best choice is A.", "A"), ("Correct option: D", "D"),
    ("My answer is C because the clip shows a bird.", "C"),
    ("The correct answer is A. Paris (C) is indeed the capital of France, and Cairo (B) is "
     "not a valid option for this question.", "A"),
    ("Looking at option A, it shows a cat; option B shows a dog. The answer is B.", "B"),
    ("Option B", "B"), ("Option (C) is correct.", "C"), ("A is the correct answer.", "A"),
    ("**D) is correct**", "D"), ("(b) is the right one", "B"),
    # JSON and tool-call arguments
    ('{"answer": "B"}', "B"), ('{"letter": "D"}', "D"), ('```json\n{"answer": "(a)"}\n```', "A"),
    ('{"choice": "C", "reason": "a bird flies"}', "C"),
    # ambiguous or no choice: None
    ("A and B", None), ("Answer: A and B", None), ("The answer is B or C.", None),
    ("A. Tokyo\nB. Nairobi", None), ("A good guess is hard", None), ("I cannot decide.", None),
    ("", None), ("   ", None), ("E", None), ("Answer: E", None), ("a cat", None),
    ("It is a dog.", None), ("The answer is a dog running.", None),
    ("A + C = 6 + 9 = 15, B + C = 4 + 3 = 7.", None),
    ("1. 9 is the answer to the question", None), ('{"answer": "B", "letter": "C"}', None),
    ("Option A is a cat, option B is a dog.", None), ('{"reason": "unsure"}', None),
]


# Chinese replies (a Qwen-style model asked in Chinese, or a skill written in Chinese) and
# full-width or invisible characters: every one read as no answer, a wrong answer.
CJK: list[tuple[str, str | None]] = [
    ("答案是B", "B"), ("答案：B", "B"), ("答案: C", "C"), ("正确答案是 (B)", "B"),
    ("答案为 A", "A"), ("答案應該是D", "D"), ("**答案：D**", "D"), ("最终答案：C", "C"),
    ("选B", "B"), ("我选择B。", "B"), ("我選擇 D", "D"), ("选择C，因为视频里有一只鸟。", "C"),
    ("答案是B，因为视频里有一只狗。", "B"), ("答案是b", "B"), ("选项B", "B"),
    ("选项 C 是正确的。", "C"), ("B选项正确", "B"), ("B。", "B"), ("（B）", "B"), ("Ｂ", "B"),
    ("答案是Ｂ", "B"), ("Ｃ．一只鸟", "C"), ("B\n\n解释：视频中的狗跑过了整个场地。", "B"),
    ("The answer is Ｂ.", "B"), ("B\u200b", "B"), ("\ufeffB", "B"), ("B\x00", "B"),
    # ambiguous or no choice
    ("A和B", None), ("答案是A或B", None), ("选项A是一只猫，选项B是一只狗。", None),
    ("A. 东京\nB. 内罗毕", None), ("我无法确定。", None), ("答案是E", None), ("ＡＢ", None),
]


# Reasoning models (DeepSeek-R1 distills, Qwen3, served without a reasoning parser) think
# in the content before they answer, and box the answer as they do in math: the thinking
# weighs every option, so the answer after it read as ambiguous, or a cut-off thinking's
# last mention read as the answer.
REASONING: list[tuple[str, str | None]] = [
    ("\\boxed{B}", "B"), ("The answer is $\\boxed{B}$.", "B"),
    ("**Final Answer**\n\n\\boxed{D}", "D"), ("答案：\\boxed{B}", "B"),
    ("$\\boxed{\\text{C}}$", "C"), ("\\boxed{(A)}", "A"), ("\\boxed{A} or \\boxed{B}", None),
    ("<think>Option A shows a cat. Option B shows a dog. Is the answer A? No, the answer is "
     "B.</think>\n\nThe answer is B.", "B"),
    ("<think>\nThe answer might be A or C.\n</think>\nC", "C"),
    ("<think>I choose A. Hmm.</think>The correct option is D.", "D"),
    ("Option A is a cat, but the dog runs...\n</think>\n\nB", "B"),  # opened by the template
    ("<think>unfinished thinking about option A", None),  # cut at max_tokens: no answer
    ("<think>A, B or C?</think>", None),
    ("Answer: `B`", "B"), ('"B"', "B"), ("Answer: <B>", "B"), ("Answer - C", "C"),
    ("Answer — D", "D"), ('Answer: "A", "B"', None), ("`A` or `B`", None),
    ("<B> is correct", "B"), ("A</think>B", "B"), ("</think>", None),
    # the letter, then its option's text after a comma: "a" there is the article
    ("The answer is B, a dog running across the field.", "B"), ("Answer: C, a bird", "C"),
    ("B, a dog", "B"), ("Answer: B/a dog", "B"), ("Answer: B, C", None), ("Answer: b, c", None),
    ("A, B or C", None), ("The answer is B, A dog.", None),
]


@pytest.mark.parametrize("text, letter", REASONING)
def test_parse_choice_reads_reasoning_model_replies(text: str, letter: str | None) -> None:
    assert parse_choice(text, 4) == letter


@pytest.mark.parametrize("text, letter", CJK)
def test_parse_choice_reads_chinese_and_full_width_replies(text: str, letter: str | None) -> None:
    assert parse_choice(text, 4) == letter


@pytest.mark.parametrize("text, letter", TABLE)
def test_parse_choice_reads_real_phrasings(text: str, letter: str | None) -> None:
    assert parse_choice(text, 4) == letter


def test_the_table_is_large() -> None:
    assert len(TABLE) >= 40 and sum(x is None for _, x in TABLE) >= 12


def test_smollm2_replies_kept_verbatim_parse_as_annotated() -> None:
    rows = json.loads(DATA.read_text(encoding="utf-8"))
    assert len(rows) >= 20
    wrong = [(r["reply"], r["letter"], parse_choice(r["reply"], r["n_options"]))
             for r in rows if parse_choice(r["reply"], r["n_options"]) != r["letter"]]
    assert wrong == []


OPTS = ("a cat", "a dog running across the whole field", "a bird", "Paris, France")


@pytest.mark.parametrize("text, letter", [
    ("a dog running across the whole field", "B"), ("A dog running across the whole field.", "B"),
    ('"a bird"', "C"), ("**a bird**", "C"), ("  paris, france  ", "D"), ("Ａ ｃａｔ", "A"),
    ("The answer is a dog.", None), ("a cat or a bird", None), ("a dog", None),
    ("B", "B"), ("A. a dog running across the whole field", "A"),  # a letter wins
])
def test_a_reply_that_is_one_options_text_chose_it(text: str, letter: str | None) -> None:
    """A model that answers with the option's words, not its letter (small models often
    do), chose that option: the reply was graded as no answer. Only the whole reply, once
    case, spacing, quotes and a closing full stop are set aside; a letter wins over text."""
    assert parse_choice(text, 4, options=OPTS) == letter
    lettered = text in ("B", "A. a dog running across the whole field")
    assert parse_choice(text, 4) == (letter if lettered else None)  # the text needs options


def test_options_alike_once_normalised_are_no_choice() -> None:
    assert parse_choice("a cat", 3, options=("A cat", "a cat.", "a dog")) is None


# Replies a degenerate or hostile server sends: runs of one character. The answer
# statement's adjacent optional spaces made "answer is" + 800 spaces take 11 s on the event
# loop (cubic), and 100,000 asterisks before a letter 115 s (quadratic): the whole gate
# stalled meanwhile. Each must read at once; in a subprocess, so a regression fails by its
# timeout instead of hanging the suite.
RUNS = {  # name: (the reply, as Python, and the letter read from it)
    "answer is + spaces": ("'answer is' + ' ' * 200_000 + '1'", None),
    "answer is + newlines": ("'Answer:' + '\\n' * 200_000 + '1'", None),
    "answer is + mixed": ("'answer is' + ' \\t\\n' * 70_000 + '1'", None),
    "asterisks": ("'*' * 200_000 + 'B'", "B"),
    "brackets": ("'(((((*' * 40_000", None),
    "wrappers": ("'(*' * 100_000", None),
    "option + spaces": ("'option A' + ' ' * 200_000 + 'x'", "A"),
    "boxed + spaces": ("'\\\\boxed{' + ' ' * 200_000 + '1'", None),
    "json fence": ("'```json' + ' ' * 200_000 + 'x'", None),
    "cjk + spaces": ("'选项' + ' ' * 200_000 + '1'", None),
}


def test_runs_of_one_character_are_read_in_linear_time() -> None:
    import subprocess
    import sys

    code = ("from vtrm_gate.llm import parse_choice\n"
            "from vtrm_gate.llm._evolver import strip_fences\n"
            + "".join(f"assert parse_choice({expr}, 4, options=('x', 'y')) == {letter!r}, "
                      f"{name!r}\nstrip_fences({expr})\n"
                      for name, (expr, letter) in RUNS.items())
            + "strip_fences('```markdown\\n' + ' ' * 200_000 + 'x')\n"
            + "strip_fences('a ```md\\nx' + ' ' * 200_000 + 'y')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_runs_are_read_as_one_character() -> None:
    """The compaction behind the linear time keeps what a run means."""
    assert parse_choice("The answer is" + " " * 50 + "B", 4) == "B"
    assert parse_choice("*" * 40 + "B" + "*" * 40, 4) == "B"
    assert parse_choice("Answer:\n\n\n\n\n(C)", 4) == "C"
    assert parse_choice("A. Tokyo\n\n\n\nB. Nairobi", 4) is None  # still two option lines
    assert parse_choice("B\n\n\n\n\nExplanation ........ it runs", 4) == "B"


@pytest.mark.parametrize(("args", "given"), [
    ({"letter": "B"}, "B"), ({"letter": "B", "answer": "C"}, "B"), ({"Answer": "C"}, "C"),
    ({"option": 2}, "2"), ({"x": "(D)"}, "(D)"), ({}, ""), ({"letter": None}, ""),
    ({"letter": True}, ""), ({"a": "B", "b": "C"}, ""), ({"answer": "B", "choice": "C"}, ""),
    ({"letter": ["B"]}, ""), ({"reason": "it runs", "answer": "B"}, "B"),
])
def test_answer_argument_reads_the_answer_calls_one_value(args: dict[str, object],
                                                          given: str) -> None:
    assert answer_argument(args) == given


# What real servers answer when the conversation does not fit the model's context: each is
# the arm's own wrong answer (its skill made the conversation too long), never INFRA.
OVERFLOWS = [
    # llama-cpp-python's server and vLLM (OpenAI's wording)
    (400, "This model's maximum context length is 2048 tokens. However, you requested 2536 "
          "tokens (2531 in the messages, 5 in the completion). Please reduce the length of the "
          "messages or completion."),
    (400, "This model's maximum context length is 4096 tokens. However, your request has 5000 "
          "input tokens. Please reduce the length of the input messages."),
    # llama.cpp's llama-server, now and before (type exceed_context_size_error)
    (400, "request (4476 tokens) exceeds the available context size (4096 tokens)"),
    (400, "the request exceeds the available context size, try increasing it"),
    # SGLang
    (400, "The input (5000 tokens) is longer than the model's context length (4096 tokens)."),
    # text-generation-inference
    (422, "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: "
          "4000 `inputs` tokens and 200 `max_new_tokens`"),
    # Gemini's OpenAI layer
    (400, "The input token count (1200000) exceeds the maximum number of tokens allowed "
          "(1048576)."),
    # LM Studio
    (400, "Trying to keep the first 5000 tokens when context the overflows. However, the model "
          "is loaded with context length of only 4096 tokens, which is not enough. Try to load "
          "the model with a larger context length, or provide a shorter input"),
    # Mistral, and Anthropic's models through a gateway
    (400, "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
          "maximum context length"),
    (400, "prompt is too long: 210000 tokens > 200000 maximum"),
]
NOT_OVERFLOWS = [
    (400, "Invalid value for 'temperature': must be between 0 and 2"),
    (400, "tools are not supported by this model"),
    (400, "max_tokens must be at least 1, got 0"),
    (500, "request (4476 tokens) exceeds the available context size (4096 tokens)"),
    (429, "Rate limit reached: too many tokens per minute"),
    (400, "The skill's context section is longer than the question."),
]


@pytest.mark.parametrize(("status", "detail"), OVERFLOWS)
def test_every_servers_context_overflow_is_read_as_one(status: int, detail: str) -> None:
    assert is_context_overflow(status, detail)


@pytest.mark.parametrize(("status", "detail"), NOT_OVERFLOWS)
def test_other_refusals_are_no_context_overflow(status: int, detail: str) -> None:
    assert not is_context_overflow(status, detail)


@pytest.mark.parametrize(("status", "detail", "filtered"), [
    (400, "The response was filtered due to the prompt triggering Azure OpenAI's content "
          "management policy. Please modify your prompt and retry.", True),
    (400, "Invalid prompt: your prompt was flagged as potentially violating our usage policy. "
          "Please try again with a different prompt.", True),
    (500, "The response was filtered due to the prompt triggering Azure OpenAI's content "
          "management policy.", False),
    (400, "Invalid value for 'temperature'", False),
    (400, "This model's maximum context length is 2048 tokens.", False),
])
def test_a_content_filters_refusal_is_read_as_one(status: int, detail: str,
                                                  filtered: bool) -> None:
    assert is_prompt_filtered(status, detail) is filtered


@pytest.mark.parametrize("depth", [1_500, 100_000])
def test_an_answer_nested_past_pythons_recursion_limit_is_no_choice_not_a_crash(
        depth: int) -> None:
    """An 18 KB reply of ``{"answer": `` nested 1,500 deep raised RecursionError out of
    parse_choice: the step ended "this is a bug", and the reply, cached before it was
    parsed, raised again on every re-run."""
    text = '{"answer": ' * depth + '"B"' + "}" * depth
    assert parse_choice(text, 4) in (None, "")
