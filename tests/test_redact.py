from __future__ import annotations

import pytest

from flowrl.trace.redact import MASK_FAILED, Redactor, redact_text

SECRETS = {
    "openai_key": "sk-abcdefghijklmnopqrstuvwxyz0123456789ABCD",
    "openai_project_key": "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz_0123456789-abcdefgh",
    "anthropic_key": "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "github_token": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "github_pat": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE",
    "google_api_key": "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "slack_token": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "jwt": (
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    ),
}


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_known_secret_formats_are_masked(name: str) -> None:
    secret = SECRETS[name]
    out = redact_text(f"here it is: {secret} -- done")
    assert secret not in out
    assert "[REDACTED:" in out
    assert out.startswith("here it is: ") and out.endswith(" -- done")


def test_aws_secret_key_bearer_private_key_and_url_password() -> None:
    aws = "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    assert "wJalrXUtnFEMI" not in redact_text(aws)
    bearer = redact_text("Authorization: Bearer abc.def-ghi_jkl0123456789")
    assert "abc.def-ghi" not in bearer and bearer.startswith("Authorization: Bearer ")
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"
    assert "MIIEpAIBAAKCAQEA" not in redact_text(f"key:\n{pem}\n")
    url = redact_text("connect to postgres://admin:s3cr3t!@db.local:5432/app")
    assert "s3cr3t" not in url and "postgres://admin:" in url and "@db.local" in url
    assert "hunter22" not in redact_text('{"password": "hunter22"}')


def test_ordinary_text_is_untouched() -> None:
    text = "The task-abcdefghijklmnopqrstuvwxyz ran 3 tools; total_tokens=120; see https://example.com/a"
    assert redact_text(text) == text


def test_secret_key_names_mask_the_value_but_not_token_counts() -> None:
    r = Redactor()
    out = r.redact({"api_key": "plain", "headers": {"Authorization": "x"}, "total_tokens": 12, "max_tokens": "1"})
    assert out == {
        "api_key": "[REDACTED:secret_key_name]",
        "headers": {"Authorization": "[REDACTED:secret_key_name]"},
        "total_tokens": 12,
        "max_tokens": "1",
    }


def test_user_mask_runs_and_a_failing_mask_fails_closed() -> None:
    assert Redactor(mask=lambda s: s.replace("Alice", "<name>")).redact_text("hi Alice") == "hi <name>"

    def broken(_: str) -> str:
        raise RuntimeError("mask bug")

    r = Redactor(mask=broken)
    assert r.redact({"q": "anything", "n": 3}) == {"q": MASK_FAILED, "n": 3}
    assert r.stats.mask_failures == 1


def test_long_values_are_truncated_with_a_hash() -> None:
    out = Redactor(max_chars=1000).redact_text("a" * 5000)
    assert len(out) < 1100 and "truncated" in out and "sha256=" in out


def test_a_failing_mask_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    def broken(_: str) -> str:
        raise RuntimeError("mask bug")

    r = Redactor(mask=broken)
    with caplog.at_level("WARNING", logger="flowrl.trace.redact"):
        r.redact(["a", "b", "c", {"d": "e"}])
    assert r.stats.mask_failures == 4
    assert len([rec for rec in caplog.records if "mask callback raised" in rec.getMessage()]) == 1
