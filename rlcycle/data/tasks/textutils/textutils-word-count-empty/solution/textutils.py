"""Small text helpers."""
import re


def slugify(text):
    """'Hello, World!' -> 'hello-world'."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)


def truncate(text, width):
    """Cut text to at most width characters, ending in '...' when cut."""
    if len(text) <= width:
        return text
    return text[: width - 3] + "..."


def word_count(text):
    """Number of whitespace-separated words."""
    return len(text.split())


def title_case(text, small_words=("a", "an", "the", "of", "and")):
    """Capitalise each word; small words stay lower case unless first."""
    words = text.lower().split()
    out = []
    for i, word in enumerate(words):
        out.append(word if i > 0 and word in small_words else word.capitalize())
    return " ".join(out)


def initials(name):
    """'Ada Lovelace' -> 'A.L.'"""
    return "".join(part[0].upper() + "." for part in name.split())
