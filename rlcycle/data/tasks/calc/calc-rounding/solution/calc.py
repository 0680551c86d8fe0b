"""A command-line calculator: python calc.py 2 + 3 '*' 4"""
import sys

PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def tokenize(expr):
    """'2+3*4' -> ['2', '+', '3', '*', '4']"""
    tokens, number = [], ""
    for ch in expr.replace(" ", ""):
        if ch.isdigit() or ch == ".":
            number += ch
            continue
        if number:
            tokens.append(number)
            number = ""
        tokens.append(ch)
    if number:
        tokens.append(number)
    return tokens


def evaluate(expr):
    """+ - * / with the usual precedence, left to right within a level."""
    values, ops = [], []

    def apply():
        b, a, op = values.pop(), values.pop(), ops.pop()
        values.append({"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op])

    for tok in tokenize(expr):
        if tok in PRECEDENCE:
            while ops and PRECEDENCE[ops[-1]] >= PRECEDENCE[tok]:
                apply()
            ops.append(tok)
        else:
            values.append(float(tok))
    while ops:
        apply()
    return values[0]


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    result = evaluate(" ".join(args))
    rounded = round(result, 2)
    print(int(rounded) if rounded == int(rounded) else rounded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
