"""Redaction measured on corpora, through the path capture takes (`redact_trace`, then the trace as stored).

A secret corpus (secret forms x the places a trace holds them) must be redacted in at least 98% of cases in
every placement; a benign corpus of ordinary code and prose may be altered in at most 2%. The figures in
docs/security.md come from `python -m tests.test_redact_corpus` (it prints them as JSON).
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flowrl.capture.assemble import complete_trace
from flowrl.capture.masking import redact_trace
from flowrl.trace.load import load_trace
from flowrl.trace.redact import MASK_FAILED, Redactor

SECRET_RATE_MIN = 0.98
BENIGN_ALTERED_MAX = 0.02

_RNG = random.Random(13)  # fixed: the corpus is the same on every run
ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "-_"
B64 = ALNUM + "+/"
HEX = "0123456789abcdef"
UPPER = string.ascii_uppercase + string.digits


def rnd(n: int, chars: str = ALNUM) -> str:
    return "".join(_RNG.choice(chars) for _ in range(n))


def _pem(kind: str, body: str) -> str:
    lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
    return f"-----BEGIN {kind}PRIVATE KEY-----\n{lines}\n-----END {kind}PRIVATE KEY-----"


def _case(name: str, secret: str, payload: str | dict[str, Any]) -> tuple[str, str, str | dict[str, Any]]:
    if isinstance(payload, str):
        payload = payload.replace("{s}", secret)
    return name, secret, payload


_RSA = rnd(256, B64)
_SSH = "b3BlbnNzaC1rZXktdjEAAAAA" + rnd(232, B64)
_BASIC = base64.b64encode(f"deploy:{rnd(16)}".encode()).decode()
_SESSION = "IQoJb3JpZ2luX2VjE" + rnd(180, B64)
_GCP = "GOCSPX-" + rnd(28, URLSAFE)

# (form, the secret that must not survive, where it sits: a text with {s}, or a dict)
SECRETS: list[tuple[str, str, str | dict[str, Any]]] = [
    _case("openai_project_key", "sk-proj-" + rnd(48, URLSAFE), "Use key {s} for the batch job."),
    _case("anthropic_key", "sk-ant-api03-" + rnd(93, URLSAFE) + "AA", "client = Anthropic(api_key='{s}')"),
    _case("github_classic_token", "ghp_" + rnd(36), "Cloning with token {s} failed: 401 Unauthorized"),
    _case("github_fine_grained_pat", "github_pat_" + rnd(22) + "_" + rnd(59), "GH_TOKEN={s} gh pr list"),
    _case(
        "gitlab_pat",
        "glpat-" + rnd(20, URLSAFE),
        "curl --header 'PRIVATE-TOKEN: {s}' https://gitlab.com/api/v4/projects",
    ),
    _case("aws_access_key_id", "AKIA" + rnd(16, UPPER), "aws configure set aws_access_key_id {s}"),
    _case("aws_secret_env", rnd(40, B64), "export AWS_SECRET_ACCESS_KEY={s}"),
    _case(
        "aws_SecretAccessKey_value",
        s := rnd(40, B64),
        {
            "Credentials": {
                "AccessKeyId": "ASIA" + rnd(16, UPPER),
                "SecretAccessKey": s,
                "Expiration": "2025-01-01T00:00:00Z",
            }
        },
    ),
    _case("aws_SessionToken_value", _SESSION, {"Credentials": {"SessionToken": _SESSION, "Expiration": "soon"}}),
    _case(
        "google_api_key",
        "AIza" + rnd(35, URLSAFE),
        "GET https://maps.googleapis.com/maps/api/geocode/json?address=Oslo&key={s}",
    ),
    _case("google_oauth_client_secret", _GCP, "The OAuth client secret {s} was rotated yesterday."),
    _case(
        "slack_bot_token",
        "xoxb-" + rnd(12, "0123456789") + "-" + rnd(13, "0123456789") + "-" + rnd(24),
        "SLACK_BOT_TOKEN is {s}",
    ),
    _case(
        "slack_webhook",
        rnd(24),
        "POST https://hooks.slack.com/services/T" + rnd(8, UPPER) + "/B" + rnd(8, UPPER) + "/{s} -> ok",
    ),
    _case("stripe_live_secret_key", "sk_live_" + rnd(24), "charge failed for key {s}"),
    _case("stripe_restricted_key", "rk_live_" + rnd(24), "Restricted key {s} lacks permission charges:write"),
    _case("huggingface_token", "hf_" + rnd(34, string.ascii_letters), "huggingface-cli login --token {s}"),
    _case("sendgrid_key", "SG." + rnd(22, URLSAFE) + "." + rnd(43, URLSAFE), "sg = SendGridAPIClient('{s}')"),
    _case(
        "npm_authToken_uuid",
        f"{rnd(8, HEX)}-{rnd(4, HEX)}-{rnd(4, HEX)}-{rnd(4, HEX)}-{rnd(12, HEX)}",
        "registry=https://registry.npmjs.org/\n//registry.npmjs.org/:_authToken={s}\n",
    ),
    _case("npm_token", "npm_" + rnd(36), "Publishing @acme/ui with {s}"),
    _case("pypi_token", "pypi-AgEIcHlwaS5vcmc" + rnd(70, URLSAFE), "twine upload -u __token__ -p {s} dist/*"),
    _case(
        "jwt",
        "eyJ" + rnd(30, URLSAFE) + ".eyJ" + rnd(60, URLSAFE) + "." + rnd(43, URLSAFE),
        "session restored from {s}",
    ),
    _case("rsa_private_key", _RSA[:64], "$ cat deploy.pem\n" + _pem("RSA ", _RSA) + "\n"),
    _case("openssh_private_key", _SSH[:64], _pem("OPENSSH ", _SSH)),
    _case("bearer_header", rnd(40, URLSAFE + "."), "Authorization: Bearer {s}"),
    _case("basic_auth_header", _BASIC, "requests.get(url, headers={'Authorization': 'Basic {s}'})"),
    _case("postgres_url_password", rnd(14) + "$!", "DATABASE_URL=postgresql://app:{s}@db.internal:5432/prod"),
    _case("redis_url_password_only", rnd(20), "redis://:{s}@cache.internal:6379/0"),
    _case("mongodb_srv_password", rnd(18), "mongodb+srv://admin:{s}@cluster0.abcde.mongodb.net/?retryWrites=true"),
    _case("token_query_param", rnd(32), "GET https://api.example.com/v1/export?format=csv&token={s}&page=2 -> 200"),
    _case(
        "access_token_fragment",
        rnd(40, URLSAFE),
        "https://app.example.com/callback#access_token={s}&token_type=bearer&expires_in=3600",
    ),
    _case("DB_PASSWORD_env", rnd(14), "DB_HOST=db\nDB_USER=app\nDB_PASSWORD={s}\nDB_NAME=prod\n"),
    _case("PGPASSWORD_env", rnd(16), "PGPASSWORD={s} psql -h db.internal -U app -c 'select 1'"),
    _case("docker_env_password", rnd(16), "docker run -e MYSQL_ROOT_PASSWORD={s} -d mysql:8"),
    _case(
        "django_SECRET_KEY",
        "django-insecure-" + rnd(50, string.ascii_lowercase + string.digits + "!@#$%^&*(-_=+)"),
        "# settings.py\nDEBUG = False\nSECRET_KEY = '{s}'\n",
    ),
    _case(
        "azure_AccountKey",
        rnd(86, B64) + "==",
        "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={s};EndpointSuffix=core.windows.net",
    ),
    _case(
        "azure_sas_sig",
        rnd(44) + "%3D",
        "https://acme.blob.core.windows.net/c/f.txt?sv=2022-11-02&se=2025-01-01&sr=b&sp=r&sig={s}",
    ),
    _case(
        "secretsmanager_SecretString",
        s := rnd(20, ALNUM + "!#%"),
        {
            "ARN": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/db",
            "Name": "prod/db",
            "SecretString": json.dumps({"username": "app", "password": s, "host": "db.internal"}),
        },
    ),
    _case(
        "cookie_in_json_text",
        s := rnd(32, HEX),
        json.dumps({"url": "https://shop.example.com/cart", "headers": {"Cookie": f"theme=dark; sid={s}"}}),
    ),
    _case("set_cookie_header", rnd(32, URLSAFE), "HTTP/1.1 302 Found\r\nSet-Cookie: session={s}; Path=/; HttpOnly\r\n"),
    _case("accessToken_value", s := rnd(40), {"accessToken": s, "expiresIn": 3600, "tokenType": "Bearer"}),
    _case("refreshToken_value", s := rnd(40), {"refreshToken": s, "userId": 42}),
    _case(
        "passphrase_value", s := "correct horse " + rnd(10), {"ssh": {"keyFile": "~/.ssh/id_ed25519", "passphrase": s}}
    ),
    _case("PGPASSWORD_value", s := rnd(16), {"env": {"PGHOST": "db.internal", "PGPASSWORD": s}}),
    _case("x_api_key_header", rnd(32), "curl -H 'x-api-key: {s}' https://api.example.com/v2/items"),
    _case("yaml_password", rnd(16), "database:\n  host: db.internal\n  password: {s}\n  pool: 5\n"),
    _case(
        "k8s_secret_data",
        base64.b64encode(rnd(12).encode()).decode(),
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ndata:\n  password: {s}\n",
    ),
    _case(
        "oauth_client_secret_form",
        rnd(40, URLSAFE),
        "POST /oauth/token grant_type=client_credentials&client_id=web&client_secret={s}",
    ),
    _case(
        "connection_string_Password", rnd(16), "Server=tcp:db.example.com,1433;Database=app;User ID=sa;Password={s};"
    ),
    _case("curl_user_password", rnd(16), "curl -u admin:{s} https://jenkins.internal/api/json"),
    _case("cli_password_flag", rnd(16), "mysql --user=root --password={s} prod < dump.sql"),
    _case("cli_token_flag", rnd(32), "flowctl deploy --api-token {s} --env prod"),
    _case("prose_api_key_hex", rnd(32, HEX), "Your new API key is: {s}. Store it somewhere safe."),
    _case("prose_password_is", "Tr0ub4dor&" + rnd(4), "The admin password is {s} until you change it."),
    _case("python_kwarg_literal", rnd(40, URLSAFE), 'client = OpenAI(api_key="{s}", base_url=url)'),
    _case("js_object_literal", rnd(32), "const config = { apiKey: '{s}', region: 'eu-west-1' };"),
    _case("twilio_auth_token", rnd(32, HEX), "TWILIO_AUTH_TOKEN={s}"),
    _case("shopify_token", "shpat_" + rnd(32, HEX), "Shopify admin API answered 200 for {s}"),
    _case("digitalocean_token", "dop_v1_" + rnd(64, HEX), "doctl auth init -t {s}"),
    _case("databricks_token", "dapi" + rnd(32, HEX), "workspace client uses {s}"),
    _case("vault_token", "hvs." + rnd(90, URLSAFE), "VAULT_ADDR=https://vault:8200 vault kv get -token {s} kv/app"),
    _case("groq_key", "gsk_" + rnd(52), "Groq replied 429 for gsk key {s}"),
    _case("langsmith_key", "lsv2_pt_" + rnd(32, HEX) + "_" + rnd(10, HEX), "tracing enabled ({s})"),
    _case("mailchimp_key", rnd(32, HEX) + "-us12", "mailchimp = Client(); mailchimp.set_config({'api': '{s}'})"),
    _case(
        "telegram_bot_token",
        rnd(10, "0123456789") + ":AA" + rnd(33, URLSAFE),
        "https://api.telegram.org/bot{s}/sendMessage?chat_id=42",
    ),
    _case("square_secret", "sq0csp-" + rnd(43, URLSAFE), "square oauth secret {s}"),
    _case("age_secret_key", "AGE-SECRET-KEY-1" + rnd(58, UPPER), "# created: 2025-01-01\n{s}\n"),
    # written after the rules above were tuned, and counted before any change for them (see the report)
    _case("netrc_password", rnd(16), "machine api.heroku.com\n  login me@example.com\n  password {s}\n"),
    _case("pgpass_line", rnd(16), "db.internal:5432:prod:app:{s}"),
    _case("docker_login_p", rnd(16), "docker login -u ci -p {s} registry.example.com"),
    _case("sshpass_p", rnd(14), "sshpass -p '{s}' ssh root@10.0.0.5 uptime"),
    _case("authorization_token_scheme", rnd(40, HEX), "Authorization: token {s}"),
    _case("x_auth_token_header", rnd(32, URLSAFE), "X-Auth-Token: {s}"),
    _case("api_key_header_json", rnd(32), '{"headers": {"api-key": "{s}", "accept": "application/json"}}'),
    _case(
        "environ_repr_in_error",
        rnd(40),
        "KeyError: 'MODEL' in environ({'PATH': '/usr/bin', 'OPENAI_API_KEY': '{s}', 'HOME': '/root'})",
    ),
    _case("tfvars_password", rnd(18), 'db_password = "{s}"\ndb_user = "app"'),
    _case("ini_password", rnd(16), "[database]\nuser = app\npassword = {s}\nport = 5432\n"),
    _case("ruby_config_api_key", rnd(32), "config.api_key = '{s}'"),
    _case("php_define_password", rnd(16), "define('DB_PASSWORD', '{s}');"),
    _case("java_properties_password", rnd(16), "spring.datasource.username=app\nspring.datasource.password={s}"),
    _case("xml_password_element", rnd(16), "<datasource><user>app</user><password>{s}</password></datasource>"),
    _case("actions_log_bearer", rnd(40, URLSAFE), 'Run curl -H "Authorization: Bearer {s}" https://api.example.com'),
    _case(
        "slack_user_token",
        "xoxp-" + rnd(12, "0123456789") + "-" + rnd(12, "0123456789") + "-" + rnd(32, HEX),
        "SLACK_USER_TOKEN: {s}",
    ),
    _case("openai_legacy_key", "sk-" + rnd(48), "openai.api_key = os.getenv('X') or '{s}'"),
    _case("anthropic_admin_key", "sk-ant-admin01-" + rnd(80, URLSAFE), "admin key {s}"),
    _case(
        "mapbox_secret_token",
        "sk.eyJ1Ijoi" + rnd(40, URLSAFE) + "." + rnd(22, URLSAFE),
        "mapboxgl.accessToken = '{s}';",
    ),
    _case("fcm_server_key", "AAAA" + rnd(7) + ":APA91b" + rnd(134, URLSAFE), "Authorization: key={s}"),
    _case("datadog_api_key", rnd(32, HEX), "DD_API_KEY={s} DD_SITE=datadoghq.eu ./agent"),
    _case("login_query_password", rnd(14), "GET /login?user=bob&password={s} HTTP/1.1"),
    _case("url_password_percent", rnd(10) + "%40" + rnd(6), "https://bob:{s}@example.com/private"),
    _case(
        "service_account_json",
        _RSA[64:128],
        json.dumps(
            {
                "type": "service_account",
                "private_key_id": rnd(40, HEX),
                "private_key": _pem("", _RSA) + "\n",
                "client_email": "sa@p.iam.gserviceaccount.com",
            }
        ),
    ),
    _case("environ_assignment", rnd(40), "os.environ['OPENAI_API_KEY'] = '{s}'"),
]


# -- placements: where capture holds a value, built as `build_trace` builds a trace --------------------------


def _trace(
    *,
    arguments: Any = None,
    result: str = "ok",
    error: str | None = None,
    output: str = "done",
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "session_id": "corpus",
        "timestamp": "2025-01-01T00:00:00+00:00",
        "user_query": "run the task",
        "tool_calls": [
            {
                "tool_name": "shell",
                "arguments": {"cmd": "ls"} if arguments is None else arguments,
                "result": result,
                "success": error is None,
                "error": error,
                "duration_ms": 1.0,
                "timestamp": "2025-01-01T00:00:00+00:00",
                "call_id": "c1",
            }
        ],
        "reasoning_steps": [],
        "final_response": "done",
        "llm_calls": [{"model": "m", "output": output}],
        "messages": None,
        "tools": [],
        "metadata": {"adapter": "generic", "method": "a_run", **(metadata or {})},
    }


def _text(payload: str | dict[str, Any]) -> str:
    return payload if isinstance(payload, str) else json.dumps(payload)


PLACEMENTS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "tool_arguments": lambda p: _trace(arguments={"input": p} if isinstance(p, str) else p),
    "tool_result": lambda p: _trace(result=_text(p)),
    "llm_output": lambda p: _trace(
        output=p if isinstance(p, str) else f"Here is the config:\n```json\n{json.dumps(p, indent=2)}\n```"
    ),
    "exception": lambda p: _trace(
        error=f"RuntimeError: request failed: {p}" if isinstance(p, str) else f"ValueError: bad config {p!r}"
    ),
    "nested": lambda p: _trace(arguments={"config": {"steps": [{"name": "deploy", "env": [p]}]}}),
    "json_in_json": lambda p: _trace(result=json.dumps({"status": 200, "body": json.dumps({"data": p})})),
    "metadata": lambda p: _trace(metadata={"note": p}),
}


def stored(data: dict[str, Any], redactor: Redactor | None = None) -> dict[str, Any]:
    """What capture writes for a built trace (`TraceCollector._build`)."""
    masked = redact_trace(redactor or Redactor(), data)
    return load_trace(complete_trace(masked), origin="corpus").model_dump(mode="json")


def _strings(value: Any) -> Iterator[str]:
    """Every string in a value, keys included, and the strings inside JSON-encoded ones."""
    if isinstance(value, str):
        yield value
        if value[:1] in "{[":
            try:
                yield from _strings(json.loads(value))
            except ValueError:
                pass
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def leaked(secret: str, trace: dict[str, Any]) -> bool:
    """A secret leaks if any 12-character piece of it (the whole, if shorter) is left anywhere."""
    width = min(len(secret), 12)
    pieces = {secret[i : i + width] for i in range(len(secret) - width + 1)}
    return any(piece in s for s in _strings(trace) for piece in pieces)


def _secret_results(placements: list[str]) -> dict[str, list[str]]:
    return {
        where: [name for name, secret, payload in SECRETS if leaked(secret, stored(PLACEMENTS[where](payload)))]
        for where in placements
    }


BENIGN: list[str] = [
    'api_key = os.environ["OPENAI_API_KEY"]',
    "password = getpass.getpass()",
    "pwd = os.getcwd()",
    "client = OpenAI(api_key=settings.OPENAI_API_KEY)",
    "def login(username: str, password: str) -> bool:\n    return check(username, password)",
    'conn = psycopg2.connect(host=host, dbname="app", user=user, password=password)',
    'token = response.json()["access_token"]',
    'headers = {"Authorization": f"Bearer {token}"}',
    "tokenizer.pad_token = tokenizer.eos_token",
    "outputs = model.generate(**inputs, max_new_tokens=256)",
    "secret = secrets.token_hex(32)",
    'API_KEY = os.getenv("API_KEY", "")',
    "auth = HTTPBasicAuth(user, password)",
    'SECRET_KEY = env("DJANGO_SECRET_KEY")',
    "tokens = tokenizer.encode(text)",
    'print(f"token usage: {usage.total_tokens}")',
    "class Settings(BaseSettings):\n    api_key: SecretStr\n    db_password: str = Field(..., min_length=12)",
    'if not api_key:\n    raise ValueError("api_key is required; set OPENAI_API_KEY")',
    "password_hash = bcrypt.hashpw(password.encode(), bcrypt.gensalt())",
    "for key, value in sorted(config.items(), key=lambda kv: kv[0]):",
    'token = jwt.encode({"sub": user.id}, key, algorithm="HS256")',
    'self.api_key = api_key or os.environ.get("ANTHROPIC_API_KEY")',
    'session.cookies.set("theme", "dark")',
    'cookie = request.cookies.get("sessionid")',
    "const apiKey = process.env.STRIPE_SECRET_KEY;",
    'export DATABASE_URL="postgres://localhost:5432/app"',
    "access_token = await get_access_token(client_id, scopes=SCOPES)",
    "refresh_token: Optional[str] = None",
    "key = hashlib.sha256(data).hexdigest()",
    'assert user.check_password(password), "wrong password"',
    'parser.add_argument("--password", help="database password (default: $PGPASSWORD)")',
    "stripe.api_key = settings.STRIPE_KEY",
    'git commit -m "fix token refresh" && git push origin main',
    "pip install scikit-learn sentencepiece tokenizers",
    'ssh-keygen -t ed25519 -C "deploy@example.com" -f ~/.ssh/deploy_key',
    'curl -H "Authorization: Bearer $GITHUB_TOKEN" https://api.github.com/user',
    "docker run -e POSTGRES_PASSWORD_FILE=/run/secrets/db_password postgres:16",
    "database:\n  host: localhost\n  password: ${DB_PASSWORD}\n",
    "      - uses: actions/checkout@v4\n        with:\n          token: ${{ secrets.GITHUB_TOKEN }}",
    '{"max_tokens": 256, "temperature": 0.7, "model": "gpt-4o-mini"}',
    '{"usage": {"prompt_tokens": 812, "completion_tokens": 97, "total_tokens": 909}}',
    '{"nextPageToken": "CAoQAA", "items": [{"id": 1, "name": "a"}]}',
    'special = {"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}',
    'with open("token_counts.csv") as f:\n    rows = list(csv.reader(f))',
    'result = subprocess.run(["pwd"], capture_output=True, text=True)',
    "HOME=/home/runner\nPATH=/usr/local/bin:/usr/bin:/bin\nPWD=/home/runner/work/app\nSHELL=/bin/bash",
    'password_reset_url = reverse("password_reset_confirm", args=[uid, token])',
    'urlpatterns = [path("login/", LoginView.as_view(), name="login")]',
    "Merged commit 3f786850e387550fdab836ed7e6dc881de23001b into main.",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  empty.txt",
    'user_id = uuid.UUID("550e8400-e29b-41d4-a716-446655440000")',
    'cache_key = f"user:{user_id}:profile"',
    'rows.sort(key=itemgetter("name"))',
    "fetch(url, { headers: { Authorization: `Bearer ${token}` } })",
    'password = input("Password: ")',
    'log.info("token refreshed, expires in %d s", ttl)',
    'resp = requests.post(url, data={"username": user, "password": pwd})',
    "config = {'api_key': API_KEY, 'timeout': 30}",
    'os.environ["GITHUB_TOKEN"] = token',
    'token_type = "bearer"',
    'secret_name = "prod/db/credentials"',
    "keys = list(d.keys())\nbypass_cache = True",
    'passport_number = form.cleaned_data["passport"]',
    "def test_invalid_token_is_rejected(client):\n"
    "    resp = client.get('/me', headers={'Authorization': 'Bearer invalid'})\n    assert resp.status_code == 401",
    "import secrets\nnonce = secrets.token_urlsafe(16)",
    "SELECT id, email FROM users WHERE password_reset_token IS NULL;",
    "Password: at least 12 characters, one digit and one symbol.",
    "To authenticate, create a personal access token under Settings and paste it when asked for a password.",
    "The tokenizer splits text into tokens; GPT-4o uses about 4 characters per token on English text.",
    "Set the `OPENAI_API_KEY` environment variable before running the script.",
    "Basic authentication sends the username and password with every request; prefer OAuth tokens.",
    "Use Bearer authentication for all API requests.",
    "I passed the secret through an environment variable instead of hard-coding it.",
    "The key insight is that the pass rate rose from 61% to 87% after the fix.",
    "Your session token is valid for 3600 seconds; refresh it before it expires.",
    "Run `pwd` to print the working directory, then `ls -la`.",
    "Tokens: 1,532 in, 212 out. Cost: $0.0041.",
    "The password is stored as a bcrypt hash, never in plain text.",
    "Rotate the API key every 90 days and revoke keys that are no longer used.",
    "## Authentication\n\nSend `Authorization: Bearer <token>` with each request. Tokens expire after one hour.",
    "Error: invalid api key provided (status 401). Check the key and try again.",
    "The secret to good tests is small fixtures; the password field is optional here.",
    "sk-learn is not a package; install scikit-learn instead.",
    # written after the rules above were tuned, and counted before any change for them (see the report)
    "for token in tokens:\n    print(token)",
    "if password != confirm_password:\n    raise ValidationError('passwords do not match')",
    "secret_santa = random.sample(people, k=len(people))",
    "keyboard = Controller()",
    "The passkey flow replaces passwords with device-bound credentials.",
    "max_token_length = 4096",
    "token_ids = tokenizer(text)['input_ids']",
    "authors = ['Ada', 'Grace']",
    "signal.signal(signal.SIGINT, handler)",
    "design: use a queue; the key point is backpressure",
    "assert response.json()['token_type'] == 'bearer'",
    "Passing tests: 41/42. Skipped: 1.",
    "keys: [id, name, email]\napi_version: 2024-06-01\nprivate: true",
    "monkeypatch.setenv('OPENAI_API_KEY', 'test-key')",
    "client = Client(token=os.environ.get('HF_TOKEN'))",
    "password_validators = [MinimumLengthValidator(12)]",
    "with pytest.raises(AuthError, match='invalid token'):",
    "The access key ID identifies the account; the secret is never shown again.",
    "huggingface-cli login  # paste the token when prompted",
    "secrets:\n  - name: db-password\n    valueFrom: vault",
    "CSRF_COOKIE_SECURE = True\nSESSION_COOKIE_AGE = 1209600",
    "AUTH_USER_MODEL = 'accounts.User'",
    "PASSWORD_HASHERS = ['django.contrib.auth.hashers.Argon2PasswordHasher']",
    "Use `git credential-cache` to keep the token in memory for 15 minutes.",
    "ssh -i ~/.ssh/id_ed25519 -o IdentitiesOnly=yes deploy@host",
    "df['key'] = df['id'].astype(str)",
    "assert auth.is_authenticated, 'login failed'",
    "print('Token:', token[:8] + '...')",
    "SECRET_KEY = get_random_secret_key()",
    "response.set_cookie('session', session_id, httponly=True)",
    "headers['Cookie'] = '; '.join(f'{k}={v}' for k, v in jar.items())",
    "Cookie consent: we only use essential cookies.",
]


def _benign_altered() -> list[str]:
    altered = []
    for text in BENIGN:
        out = stored(_trace(arguments={"code": text}, result=text, output=text))
        call = out["tool_calls"][0]
        if (call["arguments"], call["result"], out["llm_calls"][0]["output"]) != ({"code": text}, text, text):
            altered.append(text)
    return altered


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a rate k/n."""
    p, d = k / n, 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / d, z * ((p * (1 - p) + z * z / (4 * n)) / n) ** 0.5 / d
    return round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)


def measure() -> dict[str, Any]:
    """The rates docs/security.md quotes, as data (with 95% Wilson intervals)."""
    results = _secret_results(list(PLACEMENTS))
    altered = _benign_altered()
    n = len(SECRETS)
    captured = [miss for where, miss in results.items() if where != "metadata"]
    redacted = sum(n - len(miss) for miss in captured)
    return {
        "secret_forms": n,
        "placements": {
            where: {"n": n, "redacted": n - len(miss), "rate": round(1 - len(miss) / n, 4), "missed": miss}
            for where, miss in results.items()
        },
        "all_but_metadata": {
            "n": n * len(captured),
            "redacted": redacted,
            "rate": round(redacted / (n * len(captured)), 4),
            "interval95": wilson(redacted, n * len(captured)),
        },
        "benign": {
            "n": len(BENIGN),
            "altered": len(altered),
            "rate": round(len(altered) / len(BENIGN), 4),
            "interval95": wilson(len(altered), len(BENIGN)),
            "altered_texts": altered,
        },
    }


# -- the tests -------------------------------------------------------------------------------------------------


def test_the_corpora_are_broad() -> None:
    assert len(SECRETS) >= 40 and len(BENIGN) >= 60
    assert len({name for name, _, _ in SECRETS}) == len(SECRETS)


def test_secrets_are_redacted_in_every_placement() -> None:
    placements = [p for p in PLACEMENTS if p != "metadata"]
    results = _secret_results(placements)
    n = len(SECRETS)
    low = {where: miss for where, miss in results.items() if 1 - len(miss) / n < SECRET_RATE_MIN}
    total = sum(len(m) for m in results.values())
    assert not low, f"{total} of {n * len(placements)} cases leaked; under {SECRET_RATE_MIN:.0%} in: {low}"


def test_secrets_are_redacted_in_metadata() -> None:
    (miss,) = _secret_results(["metadata"]).values()
    assert 1 - len(miss) / len(SECRETS) >= SECRET_RATE_MIN, miss


def test_benign_code_and_prose_are_left_alone() -> None:
    altered = _benign_altered()
    assert len(altered) / len(BENIGN) <= BENIGN_ALTERED_MAX, (
        f"{len(altered)} of {len(BENIGN)} benign strings altered: {altered}"
    )


@pytest.mark.parametrize(
    "exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit(), RecursionError("deep"), MemoryError()]
)
def test_a_mask_raising_anything_masks_the_value_whole_and_counts(exc: BaseException) -> None:
    def mask(text: str) -> str:
        raise exc

    redactor = Redactor(mask=mask)
    out = redact_trace(redactor, _trace(output="fine", result="also fine"))
    assert out["llm_calls"][0]["output"] == MASK_FAILED and out["tool_calls"][0]["result"] == MASK_FAILED
    assert redactor.stats.mask_failures >= 2


def test_a_mask_returning_a_non_string_fails_closed() -> None:
    redactor = Redactor(mask=lambda text: None)  # type: ignore[arg-type,return-value]
    assert redactor.redact_text("hello") == MASK_FAILED and redactor.stats.mask_failures == 1


def test_json_text_without_secrets_keeps_its_exact_bytes() -> None:
    text = '{ "token_count" : 3,\n  "items": [1, 2] }'
    assert Redactor().redact_text(text) == text


def test_json_text_with_a_secret_is_masked_inside_and_stays_json() -> None:
    inner = json.dumps({"user": "app", "password": "p4ss-w0rd-xyz"})
    out = Redactor().redact_text(json.dumps({"SecretString": inner, "Name": "prod/db"}))
    assert "p4ss-w0rd-xyz" not in out and json.loads(out)["Name"] == "prod/db"


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))
