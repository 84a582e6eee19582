"""`epp serve --config-file`: a refused EndpointPickerConfig stops start-up with exit 2 and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.cli import main


def test_serve_refuses_a_config_it_cannot_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "epp.yaml"
    config.write_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins: [{type: header-profile-handler}]\n"
        "schedulingProfiles: [{name: default, plugins: []}]\n"
    )
    argv = ["serve", "--bind-address", "127.0.0.1", "--static-endpoints", "127.10.0.1:8000"]
    assert main([*argv, "--config-file", str(config)]) == 2
    err = capsys.readouterr().err
    assert "plugin 'header-profile-handler'" in err and "not implemented" in err
