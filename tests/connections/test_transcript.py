"""The README transcript (list, approve --dry-run, sync, a refused approval) runs and says what it should."""

from .transcript import E1, E2, E4, run


def test_transcript():
    lines: list[str] = []
    codes = run(lines.append)
    text = "".join(lines)
    assert codes == [0, 0, 0, 3]
    assert "[stderr] would accept" in text and "dry run: 1 change(s) planned" in text
    assert f'"decision": "accepted", "dry_run": false, "endpoint_id": "{E4}"' in text
    assert f'"decision": "left-pending", "dry_run": false, "endpoint_id": "{E2}"' in text
    assert f"refused  {E2}" in text and E1 in text
