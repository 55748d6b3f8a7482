"""The TOML node inventory (shared/infra/nodesfile.py) and TAO_NODES_FILE."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.infra.errors import SettingsError
from shared.infra.nodesfile import (
    NodesFileError,
    load_nodes_file,
    render_nodes_file,
)
from shared.infra.settings import NodeSpec, Settings

FULL = """
[[node]]
id = "gpu-a"
url = "http://10.0.0.5:8000/v1"
metrics_url = "http://10.0.0.5:8000/metrics"
kv_events = "tcp://10.0.0.5:5557"
kv_replay = "tcp://10.0.0.5:5558"
model = "Qwen/Qwen3-32B"
capacity_tokens = 524288

[[node]]
id = "gpu-b"
url = "http://10.0.0.6:8000/"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nodes.toml"
    path.write_text(text)
    return path


def test_full_file_reads_every_field(tmp_path: Path) -> None:
    a, b = load_nodes_file(_write(tmp_path, FULL))
    assert a == NodeSpec(
        "gpu-a",
        "http://10.0.0.5:8000",
        metrics_url="http://10.0.0.5:8000/metrics",
        kv_events="tcp://10.0.0.5:5557",
        kv_replay="tcp://10.0.0.5:5558",
        model="Qwen/Qwen3-32B",
        capacity_tokens=524288,
    )
    assert b == NodeSpec("gpu-b", "http://10.0.0.6:8000")
    assert b.metrics == "http://10.0.0.6:8000/metrics" and a.metrics == a.metrics_url


def test_render_round_trips(tmp_path: Path) -> None:
    nodes = load_nodes_file(_write(tmp_path, FULL))
    text = render_nodes_file(nodes, header="generated")
    assert text.startswith("# generated\n")
    assert load_nodes_file(_write(tmp_path, text)) == nodes


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            '[[node]]\nid = "a"\nurl = "http://x"\nkv_event = "tcp://x:1"\n',
            "unknown key(s) kv_event",
        ),
        ('[[node]]\nid = "a b"\nurl = "http://x"\n', "id must match"),
        ('[[node]]\nid = "a"\n', "node 'a': url is required"),
        ('[[node]]\nid = "a"\nurl = "ftp://x"\n', "url must be a http/https URL"),
        ('[[node]]\nid = "a"\nurl = "http://x"\nkv_events = "http://x"\n', "kv_events must be"),
        ('[[node]]\nid = "a"\nurl = "http://x"\nkv_replay = "tcp://x:2"\n', "needs kv_events"),
        ('[[node]]\nid = "a"\nurl = "http://x"\ncapacity_tokens = 0\n', "capacity_tokens"),
        ('[[node]]\nid = "a"\nurl = "http://x"\n[[node]]\nid = "a"\nurl = "http://y"\n', "twice"),
        (
            '[[node]]\nid = "a"\nurl = "http://x"\nh2d_gbs = 35.2\n',
            "h2d_gbs needs kv_bytes_per_gpu_token",
        ),
        (
            '[[node]]\nid = "a"\nurl = "http://x"\nkv_bytes_per_gpu_token = 0\nh2d_gbs = 1\n',
            "kv_bytes_per_gpu_token must be an integer >= 1",
        ),
        (
            '[[node]]\nid = "a"\nurl = "http://x"\nkv_bytes_per_gpu_token = 8\nh2d_gbs = "x"\n',
            "h2d_gbs must be a number > 0",
        ),
        (
            '[[node]]\nid = "a"\nurl = "http://x"\nkv_bytes_per_gpu_token = 8\nh2d_gbs = inf\n',
            "h2d_gbs must be a number > 0",
        ),
        ("nodes = 1\n", "unknown top-level key(s) 'nodes'"),
        ("[[node]\nid=", "not valid TOML"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(NodesFileError) as info:
        load_nodes_file(path)
    assert needle in str(info.value) and str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NodesFileError, match="cannot read"):
        load_nodes_file(tmp_path / "none.toml")


def test_settings_reads_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, FULL)
    s = Settings.from_env({"TAO_NODES_FILE": str(path)})
    assert [n.id for n in s.nodes] == ["gpu-a", "gpu-b"] and s.nodes_file == str(path)
    with pytest.raises(SettingsError, match=r"TAO_NODES_FILE: .*unknown key"):
        Settings.from_env(
            {"TAO_NODES_FILE": str(_write(tmp_path, '[[node]]\nid="a"\nurl="http://x"\nx=1\n'))}
        )
    with pytest.raises(SettingsError, match="either TAO_NODES or TAO_NODES_FILE"):
        Settings.from_env({"TAO_NODES_FILE": str(path), "TAO_NODES": "a=http://x"})


class TestDomains:
    def test_each_domain_sees_only_its_nodes(self, tmp_path: Path) -> None:
        """One file for the fleet: TAO_DOMAIN picks its pool, and a node naming no domain is
        every domain's; a domain left with no node is a settings error naming the domains
        there are; the domain key round-trips."""
        path = tmp_path / "nodes.toml"
        path.write_text(
            '[[node]]\nid = "a1"\nurl = "http://a1:8000"\ndomain = "pool-a"\n\n'
            '[[node]]\nid = "b1"\nurl = "http://b1:8000"\ndomain = "pool-b"\n\n'
            '[[node]]\nid = "d1"\nurl = "http://d1:8000"\n'
        )
        env = {"TAO_NODES_FILE": str(path)}
        only = tmp_path / "pools.toml"  # every node names its domain
        only.write_text(path.read_text().split('[[node]]\nid = "d1"')[0])
        by = {d: [n.id for n in Settings.from_env({**env, "TAO_DOMAIN": d}).nodes]
              for d in ("pool-a", "pool-b", "default")}  # fmt: skip
        assert by == {"pool-a": ["a1", "d1"], "pool-b": ["b1", "d1"], "default": ["d1"]}
        with pytest.raises(SettingsError, match=r"no node of domain 'pool-c'.*pool-a, pool-b"):
            Settings.from_env({"TAO_NODES_FILE": str(only), "TAO_DOMAIN": "pool-c"})
        nodes = load_nodes_file(path)
        again = tmp_path / "again.toml"
        again.write_text(render_nodes_file(nodes))
        assert load_nodes_file(again) == nodes

    def test_a_bad_domain_name_names_the_node(self, tmp_path: Path) -> None:
        path = tmp_path / "nodes.toml"
        path.write_text('[[node]]\nid = "a1"\nurl = "http://a1:8000"\ndomain = "a b"\n')
        with pytest.raises(NodesFileError, match="node 'a1': domain must match"):
            load_nodes_file(path)


class TestHostTier:
    def test_a_node_states_its_host_link(self, tmp_path: Path) -> None:
        """kv_bytes_per_gpu_token and h2d_gbs give the seconds a host-tier load takes per
        token (Qwen3-32B on TP2: 128 KiB per GPU over H100's measured 35.2 GB/s)."""
        text = FULL.replace(
            "capacity_tokens = 524288", "kv_bytes_per_gpu_token = 131072\nh2d_gbs = 35.2"
        )
        a, b = load_nodes_file(_write(tmp_path, text))
        assert (a.kv_bytes_per_gpu_token, a.h2d_gbs) == (131072, 35.2)
        assert a.host_load_s_per_token == pytest.approx(131072 / 35.2e9)
        assert b.host_load_s_per_token == 0.0  # no host tier
        again = load_nodes_file(_write(tmp_path, render_nodes_file((a, b))))
        assert again == (a, b)


class TestPrices:
    """A node names the profile its price starts from, or pins the price; both are checked."""

    def test_profile_and_pin(self, tmp_path: Path) -> None:
        from shared.core.engine.profiles import DEFAULT_PROFILE, PROFILES

        text = (
            '[[node]]\nid = "a"\nurl = "http://x"\nprofile = "deepseek-4xh100"\n'
            '[[node]]\nid = "b"\nurl = "http://y"\nprefill_s_per_token = 1.76e-4\n'
            "attn_s_per_pair = 1e-8\n"
            '[[node]]\nid = "c"\nurl = "http://z"\n'
        )
        a, b, c = load_nodes_file(_write(tmp_path, text))
        deep = PROFILES["deepseek-4xh100"]
        assert (a.prior_cost().prefill_s, a.prior_cost().source) == (deep.prefill_b, "profile")
        assert (b.prior_cost().prefill_s, b.prior_cost().attn_s) == (1.76e-4, 1e-8)
        assert b.prior_cost().source == "pinned"
        assert c.prior_cost().prefill_s == PROFILES[DEFAULT_PROFILE].prefill_b
        assert load_nodes_file(_write(tmp_path, render_nodes_file((a, b, c)))) == (a, b, c)

    @pytest.mark.parametrize(
        ("extra", "needle"),
        [
            ('profile = "h100"', "profile must be one of"),
            ("prefill_s_per_token = 1e-5", "prefill_s_per_token needs attn_s_per_pair"),
            ("prefill_s_per_token = -1.0\nattn_s_per_pair = 0", "must be a number of seconds"),
            ('prefill_s_per_token = 1e-5\nattn_s_per_pair = "x"', "attn_s_per_pair must be"),
        ],
    )
    def test_bad_prices_name_the_key(self, tmp_path: Path, extra: str, needle: str) -> None:
        path = _write(tmp_path, f'[[node]]\nid = "a"\nurl = "http://x"\n{extra}\n')
        with pytest.raises(NodesFileError, match=needle):
            load_nodes_file(path)
