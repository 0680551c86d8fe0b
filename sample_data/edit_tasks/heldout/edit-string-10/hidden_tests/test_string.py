from app import correct


def test_correct_text():
    assert correct("X") == 'Correct! The answer is X'
