from app import report


def test_report_text():
    assert report("X") == 'Success: X finished'
