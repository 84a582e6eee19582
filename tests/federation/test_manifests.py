"""The samples in manifests/federation are what the code accepts: CRD-valid sites, a valid config, read-only RBAC."""

import ipaddress
from pathlib import Path

import jsonschema
import yaml

from epp.app.config_file import load_config
from epp.config.federation import parse_federation
from epp.federation.watch import GROUP, PLURAL, site_from_object

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "federation"


def _docs(name: str) -> list[dict]:  # type: ignore[type-arg]
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def test_sample_sites_are_valid_against_the_real_crd_and_routable(reference_data: Path) -> None:
    crd = yaml.safe_load((reference_data / "crds" / "federation.llmkube.dev_federatedclusters.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    sites = []
    for obj in _docs("federatedclusters.yaml"):
        jsonschema.validate(obj, schema)
        site = site_from_object(obj, {}, 0.0, 0.0)
        assert site is not None and site.address is not None and site.tier
        assert ipaddress.ip_address(site.address.rsplit(":", 1)[0]).is_loopback
        sites.append(site)
    assert len({s.tier for s in sites}) == 2


def test_sample_config_loads_with_the_picker_config_loader(tmp_path: Path) -> None:
    (config_map,) = _docs("epp-config.yaml")
    path = tmp_path / "federation.yaml"
    path.write_text(config_map["data"]["federation.yaml"])
    picker_config = load_config(path)
    config = parse_federation(picker_config.federation, picker_config.source)
    assert {r.name for r in config.rules} == {"patient-records", "critical-stays-home"}


def test_rbac_is_read_only_on_federatedclusters() -> None:
    (role, binding) = _docs("rbac.yaml")
    assert role["kind"] == "ClusterRole" and binding["roleRef"]["name"] == role["metadata"]["name"]
    (rule,) = role["rules"]
    assert rule["apiGroups"] == [GROUP] and rule["resources"] == [PLURAL]
    assert sorted(rule["verbs"]) == ["get", "list", "watch"]
