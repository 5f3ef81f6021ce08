"""`oms bench unary-floor` serves each form over TLS from its own process and answers
every signed call: the gateway form through the gateway's real interceptor and handler
(the signature checked, the request validated), not a shortcut."""

from __future__ import annotations

import pytest

from services.command_line import main


def test_each_form_answers_its_calls(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "unary-floor", "--seconds", "0.5", "--rates", "200"])
    assert code == 0
    printed = capsys.readouterr().out
    table = printed.split("form ", 1)[1].splitlines()[1:]
    rows = {line.split()[0]: line.split() for line in table if line.strip()}
    assert set(rows) == {"bare", "interceptor", "gateway"}, printed
    for form, cells in rows.items():
        calls_per_s = float(cells[2].replace(",", ""))
        assert calls_per_s > 50, (form, printed)
