"""The random-feature kernel dictionary lives in the Params of the families that learn over one
(streamfed/algorithms/dictionary.py); the fleet configuration takes its settings at the top of `[fleet]`, where
they used to be, and moves them there — and refuses them, in one line, for a family without them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from streamfed import algorithms
from streamfed.algorithms.dictionary import DICTIONARY_FIELDS, KernelDictionary, rff_bank
from streamfed.algorithms.pofmkl import POFMKLParams
from streamfed.cli import app
from streamfed.core.features import KernelSpec, RFFBank, gaussian_dictionary, standardised_dictionary
from streamfed.fleet.config import FleetConfig, StreamfedConfig, load_config, same_fleet

WITH = [n for n in algorithms.names() if issubclass(algorithms.get(n).Params, KernelDictionary)]
WITHOUT = [n for n in algorithms.names() if n not in WITH]


def test_the_families_that_read_a_dictionary_have_one_and_the_fleet_configuration_has_none() -> None:
    assert set(WITH) == {"pofmkl", "fedbnr", "fedbnr-halflives", "fedbnr-personal", "ofskl", "ofmkl-avg", "vm-kofl",
                         "em-kofl"}
    assert {"fsgp", "pvi", "urk-fedbnr", "pfedgp"} <= set(WITHOUT)
    for field in DICTIONARY_FIELDS:
        assert field not in FleetConfig.model_fields and not hasattr(FleetConfig, field)
    assert not hasattr(FleetConfig, "kernel_specs")
    # the bin size is POF-MKL's alone: the other families upload every kernel they learn
    assert [n for n in WITH if "bin_size" in algorithms.get(n).Params.model_fields] == ["pofmkl"]


def test_the_top_level_shorthand_is_the_params_section() -> None:
    short = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=3, n_kernels=5, n_features=4, bin_size=2,
                        params={"eta": 0.1})
    long = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=3,
                       params={"n_kernels": 5, "n_features": 4, "bin_size": 2, "eta": 0.1})
    model = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=3,
                        params=POFMKLParams(n_kernels=5, n_features=4, bin_size=2, eta=0.1))
    assert short == long == model and hash(short) == hash(long) == hash(model)
    assert short.protocol_schema is long.protocol_schema  # one cache entry: equal configurations
    assert (short.params.n_kernels, short.params.n_features, short.params.bin_size) == (5, 4, 2)
    # a dump puts them in params, and reads back as the same configuration
    assert "n_kernels" not in short.model_dump() and short.model_dump()["params"]["n_kernels"] == 5
    assert FleetConfig.model_validate(short.model_dump()) == short
    # `kernels` fixes n_kernels wherever it is given
    bnr = FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, kernels=["laplacian:2", "gaussian:0.5"])
    assert bnr.params.kernels == ("laplacian:2.0", "gaussian:0.5") and bnr.params.n_kernels == 2


FILE = """
[fleet]
fleet = "f"
algorithm = "pofmkl"
n_inputs = 3
{top}
[fleet.pofmkl]
eta = 0.1
{section}
"""


def test_a_file_environment_or_section_give_the_same_fleet() -> None:
    keys = 'n_kernels = 4\nn_features = 6\nkernels = ["gaussian:1", "gaussian:2", "gaussian:3", "gaussian:4"]\n' \
           'bin_size = 2\n'
    top = StreamfedConfig.from_toml(FILE.format(top=keys, section=""), env={}).fleet
    section = StreamfedConfig.from_toml(FILE.format(top="", section=keys), env={}).fleet
    env = StreamfedConfig.from_toml(FILE.format(top="", section=""), env={
        "STREAMFED_FLEET__N_FEATURES": "6", "STREAMFED_FLEET__BIN_SIZE": "2",
        "STREAMFED_FLEET__KERNELS": '["gaussian:1", "gaussian:2", "gaussian:3", "gaussian:4"]'}).fleet
    env_section = StreamfedConfig.from_toml(FILE.format(top="", section=""), env={
        "STREAMFED_FLEET__POFMKL__N_FEATURES": "6", "STREAMFED_FLEET__POFMKL__BIN_SIZE": "2",
        "STREAMFED_FLEET__POFMKL__KERNELS": '["gaussian:1", "gaussian:2", "gaussian:3", "gaussian:4"]'}).fleet
    assert top == section == env == env_section
    assert top.params.eta == 0.1 and top.params.kernels[-1] == "gaussian:4.0"


@pytest.mark.parametrize("name", WITHOUT)
@pytest.mark.parametrize("field, value", [("n_kernels", 4), ("n_features", 8), ("kernels", ["gaussian:1"]),
                                          ("bin_size", 1)])
def test_a_dictionary_setting_for_a_family_without_one_is_refused_by_name(name: str, field: str, value) -> None:
    with pytest.raises(ValidationError) as e:
        FleetConfig(fleet="f", algorithm=name, n_inputs=2, **{field: value})
    [err] = e.value.errors()
    assert err["msg"] == f"Value error, {field}: algorithm {name!r} has no such setting"


def test_a_bin_size_for_fedbnr_and_a_setting_given_twice_are_refused() -> None:
    with pytest.raises(ValidationError, match="bin_size: algorithm 'fedbnr' has no such setting"):
        FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, bin_size=1)
    with pytest.raises(ValidationError, match="n_kernels: given both at the top of .fleet. and in the params"):
        FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=3, params={"n_kernels": 3})
    with pytest.raises(ValidationError, match=r"bin_size \(M=3\) must be <= n_kernels \(N=2\)"):
        FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=2, bin_size=3)
    with pytest.raises(ValidationError, match="n_kernels=3 but 1 kernels are listed"):
        FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=3, kernels=["gaussian:1"])
    with pytest.raises(ValidationError, match="kernels are repeated"):
        FleetConfig(fleet="f", algorithm="fedbnr", n_inputs=2, kernels=["gaussian:1", "gaussian:1.0"])


@pytest.fixture
def started(monkeypatch):
    """`AgentService.run` replaced: records that the agent would have started (nothing connects)."""
    from streamfed.runtime.agent import AgentService

    calls: list = []

    async def fake_run(self):
        calls.append(self)

    monkeypatch.setattr(AgentService, "run", fake_run)
    return calls


def _agent_with(tmp_path, algorithm: str, fleet_keys: str):
    path = tmp_path / "fleet.toml"
    path.write_text(f'[fleet]\nfleet = "f"\nalgorithm = "{algorithm}"\nn_inputs = 2\n{fleet_keys}\n'
                    '[broker]\nhost = "127.0.0.1"\nport = 1\n')
    return CliRunner().invoke(app, ["agent", "--config", str(path), "--client", "c1", "--features", "a,b",
                                    "--source", "jsonl"], input="")


def test_the_agent_refuses_a_misplaced_setting_in_one_line_and_takes_the_old_form(tmp_path, started) -> None:
    res = _agent_with(tmp_path, "fsgp", "n_features = 100")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert "n_features: algorithm 'fsgp' has no such setting" in lines[0]
    assert started == []
    res = _agent_with(tmp_path, "pofmkl", "n_kernels = 2\nn_features = 4\nbin_size = 2")
    assert res.exit_code == 0, res.output
    [svc] = started
    assert (svc.core.cfg.params.n_kernels, svc.core.cfg.params.bin_size) == (2, 2)


@pytest.mark.parametrize("standardise", ["online", "none"])
@pytest.mark.parametrize("kernels", [None, ("laplacian:0.7", "gaussian:3.0")])
def test_the_dictionary_and_its_version_follow_the_feature_maps_own_rules(standardise: str, kernels) -> None:
    """Frequencies (so the kernel version every message carries) are derived as core.features says, from the
    dictionary's specs, D, d and the seed: the rule the fleet configuration followed before the move."""
    d, n, dd, seed = 3, 2, 5, 11
    cfg = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=d, n_kernels=n, n_features=dd, kernels=kernels,
                      seed=seed, standardise=standardise)
    if kernels is not None:
        specs = [KernelSpec.parse(k) for k in kernels]
    elif standardise == "online":
        specs = standardised_dictionary(n, d)
    else:
        specs = gaussian_dictionary(n)
    want = RFFBank(specs, dd, d, seed=seed)
    assert cfg.params.kernel_specs(d, standardise) == tuple(s.key for s in specs)
    assert rff_bank(cfg).version == want.version == cfg.kernel_version
    for name in ("ofmkl-avg", "vm-kofl"):  # the baselines draw the same dictionary
        other = FleetConfig(fleet="f", algorithm=name, n_inputs=d, n_kernels=n, n_features=dd, kernels=kernels,
                            seed=seed, standardise=standardise)
        assert other.kernel_version == want.version


def test_a_dump_written_before_the_move_is_the_same_fleet() -> None:
    """State files record their fleet's dump; before the move every family's dump had the four keys at the top
    (with their defaults where the family never read them)."""
    old = {"fleet": "f", "algorithm": "fsgp", "n_inputs": 2, "n_kernels": 8, "n_features": 50, "kernels": None,
           "bin_size": 1, "params": {"n_inducing": 4}}
    fsgp = FleetConfig(fleet="f", algorithm="fsgp", n_inputs=2, params={"n_inducing": 4})
    assert FleetConfig.from_dump(old) == fsgp and same_fleet(old, fsgp)
    old_pof = old | {"algorithm": "pofmkl", "n_kernels": 4, "params": {"eta": 0.1}}
    pof = FleetConfig(fleet="f", algorithm="pofmkl", n_inputs=2, n_kernels=4, params={"eta": 0.1})
    assert same_fleet(old_pof, pof) and same_fleet(pof.model_dump(mode="json"), pof)
    assert not same_fleet(old_pof | {"n_kernels": 5}, pof)  # another dictionary: another fleet
    assert not same_fleet(old_pof | {"bin_size": 9}, pof)  # not even a valid configuration
    assert not same_fleet(None, pof) and not same_fleet(old | {"n_inputs": 3}, fsgp)


def test_an_edge_file_in_the_old_form_loads(tmp_path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[fleet]\nfleet = "f"\nalgorithm = "fedbnr"\nn_inputs = 2\nn_features = 10\n'
                    'kernels = ["gaussian:2.0"]\n[fleet.fedbnr]\nmin_upload = 8\n')
    cfg = load_config(path, env={}).fleet
    assert (cfg.params.n_features, cfg.params.kernels, cfg.params.min_upload, cfg.feature_dim) == (
        10, ("gaussian:2.0",), 8, 21)
