"""bench.go_modules: which repository, folder and git revision each Go module version is."""

from __future__ import annotations

import pytest

from bench.go_modules import repository, requirements, revision

GO_MOD = """module example.com/m

go 1.25.0

require github.com/google/uuid v1.6.0

require (
	github.com/onsi/ginkgo/v2 v2.32.0
	go.opentelemetry.io/otel/metric v1.44.0 // indirect
)
"""


def test_requirements_single_and_in_blocks() -> None:
    assert requirements(GO_MOD) == [
        ("github.com/google/uuid", "v1.6.0"),
        ("github.com/onsi/ginkgo/v2", "v2.32.0"),
        ("go.opentelemetry.io/otel/metric", "v1.44.0"),
    ]


@pytest.mark.parametrize(
    ("module", "version", "repo", "rev"),
    [
        ("github.com/onsi/ginkgo/v2", "v2.32.0", "onsi/ginkgo", "v2.32.0"),
        (
            "go.opentelemetry.io/otel/metric",
            "v1.44.0",
            "open-telemetry/opentelemetry-go",
            "metric/v1.44.0",
        ),
        ("golang.org/x/net", "v0.56.0", "golang/net", "v0.56.0"),
        ("go.yaml.in/yaml/v3", "v3.0.4", "yaml/go-yaml", "v3.0.4"),
        (
            "gopkg.in/check.v1",
            "v1.0.0-20201130134442-10cb98267c6c",
            "go-check/check",
            "10cb98267c6c",
        ),
        (
            "github.com/google/pprof",
            "v0.0.0-20260604005048-7023385849c0",
            "google/pprof",
            "7023385849c0",
        ),
    ],
)
def test_repository_and_revision(module: str, version: str, repo: str, rev: str) -> None:
    found, subdir = repository(module)
    assert found == repo
    assert revision(version, subdir) == rev
