"""cxlkv.directory without etcd: the key's hex form and the errors the C call reports.
With etcd and real orchestrators the package is exercised by tests/directory_test.cc
(DirectoryTest), which runs `cxlkv.directory.where` against a live directory."""

import pytest

from cxlkv import directory, errors
from cxlkv.keys import PrefixKey


def test_ctl_hex_is_high_word_first():
    # cxlkvctl prints coherence::FormatKey: the high word's 16 digits, then the low word's.
    k = directory.key_from_ctl_hex("fedcba98765432100123456789abcdef")
    assert k == PrefixKey(0x0123456789ABCDEF, 0xFEDCBA9876543210)
    assert directory.key_from_ctl_hex("0x1f") == PrefixKey(0x1F, 0)


@pytest.mark.parametrize("bad", ["", "12g4", "1" * 33])
def test_ctl_hex_refuses_what_is_not_a_key(bad):
    with pytest.raises(errors.InvalidArgumentError):
        directory.key_from_ctl_hex(bad)


def test_where_without_an_orchestrator_names_the_endpoint(tmp_path):
    sock = str(tmp_path / "none.sock")
    with pytest.raises(errors.CxlkvError) as e:
        directory.where(sock, PrefixKey(1, 2))
    assert "none.sock" in str(e.value)


def test_where_with_no_endpoint_is_invalid():
    with pytest.raises(errors.InvalidArgumentError):
        directory.where(" , ", PrefixKey(1, 2))
