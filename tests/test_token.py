"""The Ray token a fresh machine's first local search writes (tune_as.engine.head.ensure_token): `ray start`
in token mode refuses to start without one, and only an in-process `ray.init()` makes one. Pure file work, no
Ray."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from tune_as.engine import head as ray_head
from tune_as.errors import UserError


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home folder with no .ray in it, and no token named by the environment."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    for name in ray_head.TOKEN_ENV:
        monkeypatch.delenv(name, raising=False)
    return folder


def token_env(**extra: str) -> dict[str, str]:
    return {**os.environ, ray_head.AUTH_MODE: "token", **extra}


def test_a_fresh_home_gets_a_private_token_once(home: Path) -> None:
    path = ray_head.ensure_token(token_env())
    assert path == home / ".ray" / "auth_token"
    token = path.read_text()
    assert re.fullmatch("[0-9a-f]{64}", token), token  # Ray's form: 32 random bytes in hex
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["auth_token"]  # no temporary file left
    assert ray_head.ensure_token(token_env()) is None  # a second search keeps the first one's token
    assert path.read_text() == token


def test_two_fresh_homes_get_different_tokens(tmp_path: Path, home: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    first = ray_head.ensure_token(token_env())
    assert first is not None
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("HOME", str(other))
    second = ray_head.ensure_token(token_env())
    assert second is not None and second.read_text() != first.read_text()


@pytest.mark.parametrize("extra", [{"RAY_AUTH_TOKEN": "abc"}, {"RAY_AUTH_TOKEN_PATH": "/elsewhere/token"},
                                   {"RAY_AUTH_MODE": "disabled"}])
def test_a_token_named_elsewhere_or_no_token_mode_writes_nothing(home: Path, extra: dict[str, str]) -> None:
    assert ray_head.ensure_token(token_env(**extra)) is None
    assert not (home / ".ray").exists()


def test_a_token_another_search_wrote_first_is_kept(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: another process writes the token between the check and the link; its token stands."""
    real_link = os.link

    def other_writer_first(src: str, dst: str) -> None:
        Path(dst).write_text("theirs")
        real_link(src, dst)  # raises FileExistsError, as the real race would

    monkeypatch.setattr(os, "link", other_writer_first)
    assert ray_head.ensure_token(token_env()) is None
    folder = home / ".ray"
    assert (folder / "auth_token").read_text() == "theirs"
    assert sorted(p.name for p in folder.iterdir()) == ["auth_token"]


def test_a_home_that_cannot_hold_the_token_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unwritable HOME (a batch job's): the line names HOME and the ways around it (issue 70)."""
    monkeypatch.setenv("HOME", "/proc/nohome")
    for name in ray_head.TOKEN_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UserError) as refused:
        ray_head.ensure_token({})
    assert str(refused.value).startswith("Ray's token: expected a writable home folder for "
                                         "/proc/nohome/.ray/auth_token (HOME=/proc/nohome)"), refused.value
    assert "RAY_AUTH_TOKEN" in str(refused.value) and "\n" not in str(refused.value)
