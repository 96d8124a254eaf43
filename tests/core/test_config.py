"""Settings and the environment contract (bagua_core/config.py)."""

import pytest

from bagua_core import config


def torchrun_env(**extra):
    env = dict(
        RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="10.1.2.3", MASTER_PORT="29400"
    )
    env.update(extra)
    return env


def test_defaults_without_environment():
    s = config.load({})
    assert (s.rank, s.world_size, s.local_rank, s.local_world_size, s.node_rank) == (0, 1, 0, 1, 0)
    assert s.master_addr == "127.0.0.1"
    assert s.store_port == s.master_port + 1
    assert s.timeout_s == config.DEFAULT_TIMEOUT_S
    assert s.debug_checks is False


def test_torchrun_contract_and_store_port_rule():
    s = config.load(torchrun_env())
    assert (s.rank, s.world_size, s.local_rank, s.local_world_size) == (3, 4, 1, 2)
    assert s.node_rank == 1  # derived: rank // local_world_size
    assert s.num_nodes == 2
    assert s.master_addr == "10.1.2.3"
    assert s.store_port == 29401  # never torchrun's own store port
    assert config.load(torchrun_env(BAGUA_STORE_PORT="31000")).store_port == 31000


def test_node_rank_and_group_rank():
    assert config.load(torchrun_env(NODE_RANK="0")).node_rank == 0
    assert config.load(torchrun_env(GROUP_RANK="5")).node_rank == 5


def test_slurm_fallback():
    s = config.load(
        dict(SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_NTASKS_PER_NODE="4(x2)", SLURM_NODEID="1")
    )
    assert (s.rank, s.world_size, s.local_rank, s.local_world_size, s.node_rank) == (5, 8, 1, 4, 1)


@pytest.mark.parametrize(
    "value,expected",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
    ],
)
def test_booleans(value, expected):
    assert config.load({"BAGUA_DEBUG_CHECKS": value}).debug_checks is expected


@pytest.mark.parametrize(
    "env,message",
    [
        ({"BAGUA_DEBUG_CHECKS": "maybe"}, "not a boolean"),
        ({"BAGUA_TIMEOUT": "soon"}, "not a number"),
        ({"BAGUA_TIMEOUT": "0"}, "must be >"),
        ({"BAGUA_TIMEOUT": "inf"}, "BAGUA_TIMEOUT=inf must be at most"),
        ({"BAGUA_TIMEOUT": "1e300"}, "BAGUA_TIMEOUT=1e300 must be at most"),
        ({"BAGUA_TIMEOUT": "nan"}, "BAGUA_TIMEOUT"),
        ({"BAGUA_STORE_MAX_BYTES": "0"}, "BAGUA_STORE_MAX_BYTES=0 must be >= 1"),
        ({"BAGUA_ENGINE_LANES": "0"}, "BAGUA_ENGINE_LANES=0 must be >= 1"),
        ({"BAGUA_ENGINE_LANES": "two"}, "BAGUA_ENGINE_LANES"),
        ({"BAGUA_STORE_IDLE_TIMEOUT": "0"}, "BAGUA_STORE_IDLE_TIMEOUT=0.0 must be >"),
        ({"BAGUA_STORE_IDLE_TIMEOUT": "inf"}, "BAGUA_STORE_IDLE_TIMEOUT=inf must be at most"),
        ({"RANK": "0"}, "WORLD_SIZE"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "out of range"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, "not an integer"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"}, "exceeds"),
        ({"MASTER_PORT": "70000"}, "port out of range"),
    ],
)
def test_bad_values_raise_clear_errors(env, message):
    with pytest.raises(config.ConfigError, match=message):
        config.load(env)


def test_engine_lanes():
    assert config.load({}).engine_lanes is None  # chosen by device when the engine is built
    assert config.load({"BAGUA_ENGINE_LANES": "3"}).engine_lanes == 3


def test_store_settings():
    s = config.load({"BAGUA_STORE_SECRET": "abc", "BAGUA_STORE_MAX_VALUE_BYTES": "1000"})
    assert s.store_secret == "abc" and s.store_limits == {"max_value_bytes": 1000}
    assert config.load({}).store_secret == "" and config.load({}).store_limits == {}
    assert config.load({"BAGUA_STORE_IDLE_TIMEOUT": "2.5"}).store_limits == {"idle_timeout_s": 2.5}


def test_bagua_0_9_names_are_aliases():
    assert config.load({"BAGUA_DEFAULT_BUCKET_SIZE": "4096"}).bucket_size == 4096
    assert config.load({"BAGUA_BUCKET_SIZE": "4096", "BAGUA_DEFAULT_BUCKET_SIZE": "4096"}).bucket_size == 4096
    assert config.load(torchrun_env(BAGUA_SERVICE_PORT="31000")).store_port == 31000
    # Bagua 0.9's "choose a port" (<= 0) means our default
    assert config.load(torchrun_env(BAGUA_SERVICE_PORT="-1")).store_port == 29401
    assert config.load(torchrun_env(BAGUA_SERVICE_PORT="0", BAGUA_STORE_PORT="31000")).store_port == 31000


@pytest.mark.parametrize(
    "env,message",
    [
        ({"BAGUA_BUCKET_SIZE": "4096", "BAGUA_DEFAULT_BUCKET_SIZE": "8192"}, "disagree"),
        ({"BAGUA_STORE_PORT": "31000", "BAGUA_SERVICE_PORT": "31001"}, "disagree"),
        ({"BAGUA_DEFAULT_BUCKET_SIZE": "big"}, "BAGUA_DEFAULT_BUCKET_SIZE='big' is not an integer"),
        ({"BAGUA_SERVICE_PORT": "x"}, "BAGUA_SERVICE_PORT='x' is not an integer"),
    ],
)
def test_bad_aliases(env, message):
    with pytest.raises(config.ConfigError, match=message):
        config.load(env)


def test_launched_tells_whether_a_launcher_set_the_environment():
    assert config.load({}).launched is False
    assert config.load(torchrun_env()).launched is True
    assert config.load(dict(SLURM_PROCID="0", SLURM_NTASKS="1")).launched is True


def test_log_level():
    assert config.load({}).log_level is None
    assert config.load({"BAGUA_LOG_LEVEL": "info"}).log_level == "INFO"
    with pytest.raises(config.ConfigError, match="BAGUA_LOG_LEVEL='loud' is not one of DEBUG"):
        config.load({"BAGUA_LOG_LEVEL": "loud"})
