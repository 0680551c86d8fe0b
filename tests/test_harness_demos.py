"""Reference solutions rendered through the harness (the warm-start demonstrations)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcycle.harness.demos import reference_transcript
from rlcycle.harness.parse import parse_completion
from rlcycle.harness.render import ChatRenderer

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"


def tiny_tasks():
    from rlcycle.tasks.suite import Task

    return [
        Task(
            id="add-fix",
            instruction="Fix add() in calc.py: it subtracts.",
            cluster="calc",
            difficulty=1,
            repo={"calc.py": "def add(a, b):\n    return a - b\n"},
            hidden_tests={"test_calc.py": "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
            solution={"calc.py": "def add(a, b):\n    return a + b\n"},
        ),
        Task(
            id="fmt",
            instruction="Format the price in shop.py.",
            cluster="shop",
            difficulty=2,
            ambiguous=True,
            clarification_answer="Two decimals with a dollar sign, e.g. $3.50.",
            repo={"shop.py": "def price(x):\n    return str(x)\n"},
            hidden_tests={
                "test_shop.py": "from shop import price\n\ndef test_price():\n    assert price(3.5) == '$3.50'\n"
            },
            solution={"shop.py": "def price(x):\n    return f'${x:.2f}'\n"},
        ),
    ]


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer.from_pretrained(SAMPLE / "tokenizer")


def test_reference_turns_are_valid_calls_and_the_only_trained_tokens(renderer):
    from rlcycle.tasks import reference_calls

    for task in tiny_tasks():
        tr = reference_transcript(task, renderer)
        names = []
        for turn in tr.turns:
            parsed = parse_completion(renderer.completion_text(turn.completion_ids))
            assert parsed.all_valid and len(parsed.calls) == 1 and parsed.content == ""
            names.append(parsed.calls[0].name)
        assert names == [c.name for c in reference_calls(task)]
        assert sum(tr.mask) == sum(len(t.completion_ids) for t in tr.turns)
        assert tr.ids == renderer.render(tr.messages)[: len(tr.ids)]  # canonical ids: no drift


def test_ambiguous_task_asks_then_continues_with_the_answer(renderer):
    tr = reference_transcript(tiny_tasks()[1], renderer)
    roles = [m["role"] for m in tr.messages]
    asked = roles.index("user", 2)  # the second user message: the clarification answer
    assert '"ask_user"' in tr.messages[asked - 1]["content"]
    assert tr.messages[asked]["content"].startswith("Two decimals")
    assert "def price(x):\n    return str(x)" in tr.messages[3]["content"]  # read_file output
