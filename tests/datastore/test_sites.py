from epp.datastore.sites import Site, SiteRegistry


def test_sites_are_sorted_by_name_and_cached_until_a_change() -> None:
    reg = SiteRegistry()
    reg.put(Site(name="b"))
    reg.put(Site(name="a"))
    first = reg.sites()
    assert [s.name for s in first] == ["a", "b"]
    version = reg.version
    reg.put(Site(name="a"))  # same value: no change
    assert reg.sites() is first and reg.version == version
    reg.put(Site(name="a", tier="eu"))
    assert reg.sites() is not first and reg.get("a").tier == "eu"  # type: ignore[union-attr]


def test_replace_all_reports_added_and_removed() -> None:
    reg = SiteRegistry()
    reg.replace_all([Site(name="a"), Site(name="b")])
    assert reg.replace_all([Site(name="b"), Site(name="c")]) == (1, 1)
    assert "a" not in reg and len(reg) == 2


def test_inflight_is_counted_and_never_negative_even_after_removal() -> None:
    reg = SiteRegistry()
    reg.put(Site(name="a"))
    reg.book("a")
    reg.book("a")
    reg.remove("a")
    reg.release("a")
    assert reg.inflight("a") == 1
    reg.release("a")
    reg.release("a")
    assert reg.inflight("a") == 0
