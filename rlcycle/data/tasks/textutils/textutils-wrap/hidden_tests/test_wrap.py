from textutils import wrap


def test_greedy_packing():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_exact_fit():
    assert wrap("aaa bbb", 7) == ["aaa bbb"]


def test_long_word_alone():
    assert wrap("a extraordinarily b", 5) == ["a", "extraordinarily", "b"]


def test_empty():
    assert wrap("", 10) == []
    assert wrap("   ", 10) == []
