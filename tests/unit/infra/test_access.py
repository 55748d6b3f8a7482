"""The access folder: roles, permissions, URL files and their errors (no server here; the
servers' own verdicts are in tests/e2e/test_e2e_access.py)."""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

from shared.cli.main import main
from shared.contracts import subjects
from shared.infra.access import (
    ACCESS_FILE,
    ADMIN,
    CA_FILE,
    NATS_CONF,
    NATS_GRANTS,
    REDIS_ACL,
    ROLES,
    SERVICE_ROLES,
    Access,
    AccessFileError,
    _nats_permissions,
    nats_authorization,
    read_access_dir,
    redact,
    redis_acl,
    role_url,
    write_access_dir,
)
from shared.infra.errors import SettingsError
from shared.infra.redisconn import startup_nodes
from shared.infra.settings import Settings
from tests.grant_uses import (
    HELPERS,
    MADE_ELSEWHERE,
    ROLE_CODE,
    ROOT,
    all_sites,
    api_calls,
    code_files,
    role_uses,
    unresolved,
)


def _users(conf: str) -> dict[str, dict[str, object]]:
    """role -> permissions, from the rendered authorization block (one user per line)."""
    out = {}
    for line in conf.splitlines():
        found = re.match(r'\s*\{user: "(\w+)", password: "[^"]+", permissions: (\{.*\})\}$', line)
        if found:
            out[found.group(1)] = json.loads(found.group(2))
    return out


def _allows(patterns: list[str], subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest."""
    want = subject.split(".")
    for pattern in patterns:
        toks = pattern.split(".")
        rest = toks[-1] == ">"
        head = toks[:-1] if rest else toks
        if (len(want) > len(head) if rest else len(want) == len(head)) and all(
            t in ("*", w) for t, w in zip(head, want, strict=False)
        ):
            return True
    return False


class TestNatsPermissions:
    def setup_method(self) -> None:
        self.users = _users(nats_authorization(Access.new().passwords, [""]))

    def test_every_role_has_a_user(self) -> None:
        assert set(self.users) == set(ROLES)

    def test_only_the_planner_and_admin_publish_placements(self) -> None:
        subject = subjects.placement("gw0")
        allowed = {r for r, p in self.users.items() if _allows(p["publish"]["allow"], subject)}  # type: ignore[index]
        assert allowed == {"planner", ADMIN}

    def test_a_hook_publishes_only_hook_subjects_and_calls_no_stream_api(self) -> None:
        hook = self.users["hook"]["publish"]["allow"]  # type: ignore[index]
        assert hook == [subjects.hook_events_all()]

    def test_each_role_reads_only_its_own_inbox(self) -> None:
        for role, perms in self.users.items():
            if role == ADMIN:
                continue
            subs = perms["subscribe"]["allow"]  # type: ignore[index]
            assert f"_INBOX_{role}.>" in subs
            others = [r for r in ROLES if r not in (role, ADMIN)]
            assert not any(_allows(subs, f"_INBOX_{o}.x") for o in others)
            assert not _allows(subs, "_INBOX.x")

    def test_namespaces_prefix_every_subject_and_stream(self) -> None:
        users = _users(nats_authorization(Access.new().passwords, ["ns1", "ns2"]))
        planner = users["planner"]["publish"]["allow"]  # type: ignore[index]
        assert _allows(planner, "ns1." + subjects.placement("gw0"))
        assert _allows(planner, "ns2." + subjects.placement("gw0"))
        assert not _allows(planner, subjects.placement("gw0"))  # not outside its namespaces
        tools = users["tools"]["publish"]["allow"]  # type: ignore[index]
        assert "$JS.API.CONSUMER.DURABLE.CREATE.ns1_TAO_V1_TOOL.*" in tools
        assert "$JS.ACK.ns2_TAO_V1_HOOK.>" in tools

    def test_only_the_inspect_responder_may_answer_requests(self) -> None:
        responders = {r for r, p in self.users.items() if p.get("allow_responses")}
        assert responders == {"telemetry"}


def _covers(pattern: str, used: str) -> bool:
    """Whether the NATS subject pattern ``pattern`` admits every subject that ``used`` (a
    subject, or a subscription's pattern) names: ``*`` one token, ``>`` the rest."""
    want, have = pattern.split("."), used.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or have[i] == ">" or token not in ("*", have[i]):
            return False
    return len(want) == len(have)


def _both_ways(granted: Iterable[str], used: Iterable[str]) -> tuple[list[str], list[str]]:
    """(what is used and no grant admits, grants that admit nothing used)."""
    granted, used = sorted(set(granted)), sorted(set(used))
    missing = [u for u in used if not any(_covers(g, u) for g in granted)]
    extra = [g for g in granted if not any(_covers(g, u) for u in used)]
    return missing, extra


USES = role_uses()
"""What each role's code does on NATS, read from the code (tests/grant_uses.py)."""


class TestGrantsMatchTheCode:
    """Each role's grant is what its code does on NATS, both ways: nothing it does is refused
    (a refused core publish fails silently: the planner's replan wake-ups and the valuation's
    domain loads went nowhere, and the kv-bridge retried its stream update for ever, under the
    access control of ``tao up`` and compose), and nothing is granted that it does not do."""

    def test_every_call_that_reaches_nats_is_read(self) -> None:
        """The calls whose subject is made elsewhere are the ones listed (a new one must say
        what it publishes), and every file that reaches NATS runs as some role."""
        assert unresolved() == set(MADE_ELSEWHERE)
        owned = {
            path.relative_to(ROOT).as_posix()
            for code in ROLE_CODE.values()
            for where in code
            for path in code_files(where)
        }
        assert set(all_sites()) - owned - HELPERS == set()
        assert set(ROLE_CODE) == set(ROLES) - {ADMIN}

    @pytest.mark.parametrize("role", sorted(ROLE_CODE))
    def test_the_grant_is_what_the_code_does(self, role: str) -> None:
        grant, uses = NATS_GRANTS[role], USES[role]
        assert _both_ways(grant.publish, uses.publish) == ([], []), "publish"
        assert _both_ways(grant.subscribe, uses.subscribe) == ([], []), "subscribe"
        assert set(grant.consumes) == uses.consumes, "durable consumers"
        assert set(grant.ephemeral) == uses.ephemeral, "ephemeral consumers"
        flags = (grant.streams, grant.responds, grant.leases, grant.everything)
        assert flags == (uses.streams, uses.responds, uses.leases, False)

    @pytest.mark.parametrize("namespace", ["", "ns1"])
    @pytest.mark.parametrize("role", sorted(ROLE_CODE))
    def test_the_rendered_permissions_are_what_the_client_sends(
        self, role: str, namespace: str
    ) -> None:
        """The server's permissions, JetStream API included, against the subjects the role's
        client publishes and subscribes to (as ``Bus`` makes them; tests/integration/
        test_access_grants.py checks that on a server)."""
        perms = _nats_permissions(role, [namespace])
        pub, sub = api_calls(role, USES[role], namespace)
        assert _both_ways(perms["publish"]["allow"], pub) == ([], [])  # type: ignore[index]
        assert _both_ways(perms["subscribe"]["allow"], sub) == ([], [])  # type: ignore[index]
        assert bool(perms.get("allow_responses")) == USES[role].responds

    def test_the_reported_gaps_are_closed(self) -> None:
        """The valuation publishes its domain load each tick and the gateway reads it; the
        kv-bridge (ops) creates or updates the streams at start-up."""
        users = _users(nats_authorization(Access.new().passwords, [""]))
        assert _allows(users["valuation"]["publish"]["allow"], subjects.domain_load())  # type: ignore[index]
        assert _allows(users["gateway"]["subscribe"]["allow"], subjects.domain_load())  # type: ignore[index]
        assert "$JS.API.STREAM.UPDATE.TAO_V1_TOOL" in users["ops"]["publish"]["allow"]  # type: ignore[index]


class TestRedisAcl:
    def setup_method(self) -> None:
        self.access = Access.new()
        self.lines = {
            line.split()[1]: line for line in redis_acl(self.access.passwords).splitlines()
        }

    def test_the_default_user_may_only_ping(self) -> None:
        assert self.lines["default"] == (
            "user default on nopass resetkeys resetchannels -@all +ping"
        )

    def test_passwords_are_stored_as_digests_only(self) -> None:
        text = redis_acl(self.access.passwords)
        assert not any(pw in text for pw in self.access.passwords.values())
        assert all(">" not in line for line in text.splitlines())

    @pytest.mark.parametrize("role", ["gateway", "ops"])
    def test_readers_cannot_write(self, role: str) -> None:
        line = self.lines[role]
        assert "+@write" not in line and "%RW~" not in line and "%R~tao:*" in line

    def test_a_hook_touches_no_key(self) -> None:
        assert self.lines["hook"].endswith("resetkeys resetchannels -@all")

    def test_writers_write_only_their_kinds(self) -> None:
        assert "%RW~tao:{*}:toolstats" in self.lines["tools"]
        assert "%RW~tao:{*}:toolstats" not in self.lines["planner"]
        assert "%RW~tao:{*}:s:*" not in self.lines["telemetry"]
        assert "-@dangerous" in self.lines["planner"]


class TestFolder:
    def test_round_trip_and_modes(self, tmp_path: Path) -> None:
        access = Access.new("nats://n:4222", "redis://r:6379/0", ["", "ns"])
        write_access_dir(access, tmp_path)
        assert read_access_dir(tmp_path) == replace(access, folder=str(tmp_path.resolve()))
        for name in (ACCESS_FILE, NATS_CONF, "planner.nats-url", "planner.redis-url"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
        assert stat.S_IMODE((tmp_path / REDIS_ACL).stat().st_mode) == 0o644
        url = (tmp_path / "gateway.nats-url").read_text().strip()
        assert url == f"nats://gateway:{access.passwords['gateway']}@n:4222"

    def test_tls_urls_name_the_ca_and_the_certificate_covers_the_hosts(
        self, tmp_path: Path
    ) -> None:
        from cryptography import x509

        access = Access.new("nats://nats:4222", "redis://redis:6379/0", tls=("nats", "redis"))
        write_access_dir(access, tmp_path)
        got = read_access_dir(tmp_path)
        ca = str(tmp_path.resolve() / CA_FILE)
        assert got.nats("tools") == f"tls://tools:{got.passwords['tools']}@nats:4222?ca={ca}"
        assert got.redis("tools").startswith(f"rediss://tools:{got.passwords['tools']}@redis:")
        assert got.redis("tools").endswith(f"?ssl_ca_certs={ca}")
        cert = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert {"nats", "redis", "localhost"} <= set(sans.get_values_for_type(x509.DNSName))
        assert f'ca_file: "{ca}"' in (tmp_path / NATS_CONF).read_text()
        assert stat.S_IMODE((tmp_path / "server-key.pem").stat().st_mode) == 0o600
        before = (tmp_path / "server.pem").read_bytes()
        write_access_dir(got.rotated("hook"), tmp_path)  # a rotation keeps the certificate
        assert (tmp_path / "server.pem").read_bytes() == before
        with pytest.raises(ValueError, match="unknown TLS server 'kafka'"):
            Access.new(tls=("kafka",))

    def test_rotation_changes_one_role(self) -> None:
        access = Access.new()
        rotated = access.rotated("hook")
        changed = {r for r in ROLES if access.passwords[r] != rotated.passwords[r]}
        assert changed == {"hook"}
        with pytest.raises(ValueError, match="unknown role 'nobody'"):
            access.rotated("nobody")

    @pytest.mark.parametrize(
        ("text", "reason"),
        [
            ("not toml = [", "not TOML"),
            ('nats_url = "nats://a"\nredis_url = "redis://b"\n', r"\[passwords\] must map"),
            (
                'nats_url = "nats://a"\nredis_url = "redis://b"\n[passwords]\nroot = "x"\n',
                "unknown role 'root'",
            ),
            ('nats_url = 3\nredis_url = "redis://b"\n[passwords]\nhook = "x"\n', "nats_url must"),
        ],
    )
    def test_a_bad_file_names_what_is_wrong(self, tmp_path: Path, text: str, reason: str) -> None:
        (tmp_path / ACCESS_FILE).write_text(text)
        with pytest.raises(AccessFileError, match=reason) as err:
            read_access_dir(tmp_path)
        assert str(tmp_path / ACCESS_FILE) in str(err.value)

    def test_a_missing_folder(self, tmp_path: Path) -> None:
        with pytest.raises(AccessFileError, match="not found"):
            read_access_dir(tmp_path / "nowhere")


class TestUrls:
    def test_redact_hides_only_the_password(self) -> None:
        assert redact("nats://planner:s3cret@host:4222") == "nats://planner:***@host:4222"
        assert redact("redis://host:6379/0") == "redis://host:6379/0"
        assert "s3cret" not in redact("redis://u:s3cret@[::1]:6379/0")

    def test_role_url_replaces_any_user_information(self) -> None:
        assert role_url("nats://old:pw@h:1", "tools", "p w") == "nats://tools:p%20w@h:1"

    def test_a_bad_url_error_never_shows_the_password(self) -> None:
        with pytest.raises(SettingsError) as err:
            Settings.from_env({"TAO_NATS_URL": "http://u:s3cret@h:1"})
        assert "s3cret" not in str(err.value) and "TAO_NATS_URL" in str(err.value)


class TestUrlFiles:
    def test_the_file_gives_the_url(self, tmp_path: Path) -> None:
        (tmp_path / "u").write_text("nats://tools:pw@h:4222\n")
        (tmp_path / "r").write_text("redis://tools:pw@h:6379/0")
        settings = Settings.from_env(
            {"TAO_NATS_URL_FILE": str(tmp_path / "u"), "TAO_REDIS_URL_FILE": str(tmp_path / "r")}
        )
        assert settings.nats_url == "nats://tools:pw@h:4222"
        assert settings.redis_url == "redis://tools:pw@h:6379/0"

    @pytest.mark.parametrize(
        ("env", "reason"),
        [
            ({"TAO_NATS_URL_FILE": "/nonexistent/u"}, "cannot read"),
            ({"TAO_NATS_URL_FILE": "EMPTY"}, "the file is empty"),
            ({"TAO_NATS_URL_FILE": "EMPTY", "TAO_NATS_URL": "nats://h"}, "set either"),
        ],
    )
    def test_errors_name_the_variable(
        self, tmp_path: Path, env: dict[str, str], reason: str
    ) -> None:
        (tmp_path / "empty").write_text("\n")
        env = {k: str(tmp_path / "empty") if v == "EMPTY" else v for k, v in env.items()}
        with pytest.raises(SettingsError, match=f"TAO_NATS_URL_FILE.*{reason}"):
            Settings.from_env(env)


class TestCommand:
    def test_writes_then_keeps_then_rotates(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        folder = tmp_path / "access"
        assert main(["keys", "access", "--dir", str(folder), "--namespace", "ns"]) == 0
        first = read_access_dir(folder)
        assert first.namespaces == ("ns",)
        assert set(SERVICE_ROLES) <= set(first.passwords)
        assert main(["keys", "access", "--dir", str(folder), "--if-missing"]) == 0
        assert read_access_dir(folder) == first
        assert main(["keys", "access", "--dir", str(folder), "--rotate", "tools"]) == 0
        after = read_access_dir(folder)
        assert after.passwords["tools"] != first.passwords["tools"]
        assert after.passwords["planner"] == first.passwords["planner"]
        assert after.passwords["tools"] in (folder / "tools.nats-url").read_text()

    def test_refuses_to_overwrite(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["keys", "access", "--dir", str(tmp_path)]) == 0
        capsys.readouterr()
        assert main(["keys", "access", "--dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "pass --rotate or --if-missing" in err[0]


class TestClusterUrls:
    """A NATS cluster's server list and a Redis Cluster URL (deploy/compose.domains.yaml)."""

    def test_each_nats_server_gets_the_credentials(self) -> None:
        url = role_url("nats://a:4222,nats://b:4222", "tools", "pw")
        assert url == "nats://tools:pw@a:4222,nats://tools:pw@b:4222"

    def test_a_redis_cluster_url_gets_them_once(self) -> None:
        url = role_url("redis+cluster://r1:6379,r2:6379", "tools", "pw")
        assert url == "redis+cluster://tools:pw@r1:6379,r2:6379"
        assert startup_nodes(url) == [("r1", 6379), ("r2", 6379)]

    def test_readers_may_read_the_slot_map(self) -> None:
        lines = {ln.split()[1]: ln for ln in redis_acl(Access.new().passwords).splitlines()}
        for role in ("telemetry", "tools", "valuation", "planner", "gateway", "ops"):
            assert "+cluster|slots" in lines[role] and "+cluster|shards" in lines[role], role
        assert "cluster" not in lines["hook"] and "cluster" not in lines["default"]
