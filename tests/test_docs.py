"""The documents cannot drift from the code: docs/isa.md's tables against hw/isa.py's layouts, the
README's quick start, config table, command-line reference and Python examples."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from systolic.compiler.cli import build_parser, config_fields_markdown
from systolic.hw.isa import (
    FIELDS,
    HEADER_BYTES,
    HEADER_LAYOUT,
    INSTR_BYTES,
    ISA_VERSION,
    QUEUE_OF,
    Field,
    Instruction,
    Opcode,
    Program,
    Queue,
)

ROOT = Path(__file__).resolve().parents[1]
ISA_MD = (ROOT / "docs" / "isa.md").read_text()
README = (ROOT / "README.md").read_text()
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
TOKEN_FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")


def _section(markdown: str, heading: str) -> str:
    """The text under the first heading that starts with ``heading``, up to the next heading of the
    same or a higher level."""
    match = re.search(rf"^(#+) {re.escape(heading)}.*$", markdown, re.M)
    assert match, f"no heading {heading!r}"
    level = len(match.group(1))
    end = re.search(rf"^#{{1,{level}}} ", markdown[match.end():], re.M)
    return markdown[match.end(): match.end() + end.start() if end else len(markdown)]


def _table(section: str) -> list[list[str]]:
    """Rows (cells stripped) of the first Markdown table in ``section``, header and rule excluded."""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert len(lines) >= 3, "no table"
    block = []
    for line in lines[2:]:
        block.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return block


def _doc_fields(section: str) -> list[tuple[str, str]]:
    """(field name, width spec) in document order from a `| field | bits | meaning |` table;
    a row naming several fields gives each its spec (``u24 each``, or ``u16, u16, u8``)."""
    out = []
    for cells in _table(section):
        names = re.findall(r"`(\w+)`", cells[0])
        specs = [s.strip() for s in cells[1].removesuffix(" each").split(",")]
        if len(specs) == 1:
            specs = specs * len(names)
        assert len(specs) == len(names), f"row {cells[0]!r} has {len(names)} fields but bits {cells[1]!r}"
        out.extend(zip(names, specs, strict=True))
    return out


def _spec_of(f: Field) -> str:
    """A field's width as isa.md writes it: ``s16``, ``u6``, or a bare width for an enumeration."""
    if f.enum is not None:
        return str(f.width)
    return f"{'s' if f.signed else 'u'}{f.width}"


# -- docs/isa.md against hw/isa.py ------------------------------------------------------------

@pytest.mark.parametrize("op", [Opcode.CONFIG, Opcode.LOAD, Opcode.COMPUTE, Opcode.STORE, Opcode.SYNC],
                         ids=lambda op: op.name)
def test_isa_field_table_matches_layout(op: Opcode) -> None:
    section = _section(ISA_MD, op.name)
    documented = _doc_fields(section)
    layout = [(f.name, _spec_of(f)) for f in FIELDS[op] if f.name not in TOKEN_FLAGS]
    assert [name for name, _ in documented] == [name for name, _ in layout], "field names or order differ"
    assert documented == layout, "field widths or signedness differ"


@pytest.mark.parametrize("op", list(Opcode), ids=lambda op: op.name)
def test_isa_section_heading_names_opcode_and_queue(op: Opcode) -> None:
    match = re.search(rf"^## {op.name} \(opcode (\d+)(?:, (\w+) queue)?\)$", ISA_MD, re.M)
    assert match, f"no '## {op.name} (opcode N...)' heading"
    assert int(match.group(1)) == op.value
    queue = QUEUE_OF[op]
    assert match.group(2) == (queue.name.lower() if queue is not None else None)


def test_isa_enum_meanings_match() -> None:
    """The meaning column's ``0 name, 1 name ...`` lists are the enum members."""
    for op in Opcode:
        if op is Opcode.FINISH:
            continue
        fields = {f.name: f for f in FIELDS[op]}
        for cells in _table(_section(ISA_MD, op.name)):
            names = re.findall(r"`(\w+)`", cells[0])
            f = fields[names[0]]
            if f.enum is None:
                continue
            listed = [(int(v), n) for v, n in re.findall(r"(\d+) `?(\w+)`?", cells[2])]
            assert listed == [(m.value, m.name.lower()) for m in f.enum], (op.name, f.name)


def test_isa_header_table_matches() -> None:
    rows = _table(_section(ISA_MD, "Instruction word"))
    documented = {}
    for bits, name, meaning in rows:
        hi, _, lo = bits.partition(":")
        documented[name.strip("`")] = (int(lo or hi), int(hi) - int(lo or hi) + 1)
        if name == "`opcode`":
            listed = re.findall(r"(\d+) ([A-Z]+)", meaning)
            assert [(int(v), n) for v, n in listed] == [(o.value, o.name) for o in Opcode]
    assert documented == {name: (f.offset, f.width) for name, f in HEADER_LAYOUT}


def test_isa_program_header_table_matches() -> None:
    table = _table(_section(ISA_MD, "Program binary"))
    rows = [(int(offset), int(size), field) for offset, size, field in table]
    assert [offset for offset, _, _ in rows] == [0] + [o + s for o, s, _ in rows[:-1]], "gaps or overlaps"
    assert sum(size for _, size, _ in rows) == HEADER_BYTES
    blob = Program((Instruction(Opcode.FINISH),) * 5, 0x0102030405060708).to_bytes()

    def at(prefix: str) -> bytes:
        (offset, size), = [(o, s) for o, s, field in rows if field.startswith(prefix)]
        return blob[offset: offset + size]

    assert at("magic") == b"SYST"
    assert int.from_bytes(at("ISA version"), "little") == ISA_VERSION
    assert int.from_bytes(at("instruction size"), "little") == INSTR_BYTES
    assert int.from_bytes(at("config hash"), "little") == 0x0102030405060708
    assert int.from_bytes(at("instruction count"), "little") == 5
    assert at("reserved") == bytes(12)


def test_isa_sync_queue_names() -> None:
    assert [q.name.lower() for q in Queue] == ["load", "compute", "store"]


# -- README -----------------------------------------------------------------------------------------

def test_readme_quick_start_is_three_commands() -> None:
    block = re.search(r"```\n(.*?)```", _section(README, "Quick start"), re.S)
    assert block, "no code block under Quick start"
    assert block.group(1).splitlines() == ['pip install -e ".[dev]"', "systolic demo", "pytest"]


def test_readme_config_table_is_generated() -> None:
    match = re.search(r"<!-- config-fields:begin -->\n(.*?)<!-- config-fields:end -->", README, re.S)
    assert match, "README lacks the config-fields markers"
    assert match.group(1) == config_fields_markdown(), \
        "README's config table is stale: paste the output of `systolic config --help-fields`"


def test_readme_documents_every_command_and_flag() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in commands.items():
        section = _section(README, f"`systolic {name}`")
        for action in sub._actions:
            if action.dest == "help":
                continue
            spellings = action.option_strings or [action.metavar]
            for spelling in spellings:
                assert f"`{spelling}" in section, f"README's `systolic {name}` section lacks {spelling}"


def test_readme_links_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        assert (ROOT / target).exists(), target
    assert "docs/isa.md" in README and "docs/architecture.md" in README


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_readme_python_example_runs(index: int, tmp_path, monkeypatch, capsys) -> None:
    block = _python_blocks()[index]
    if "systolic.sim.golden" in block:
        pytest.importorskip("systolic.sim.golden", reason="the golden model is not in this tree yet")
    monkeypatch.chdir(tmp_path)   # examples may write files
    exec(compile(block, f"README.md python block {index}", "exec"), {})


def test_readme_has_python_examples() -> None:
    assert len(_python_blocks()) >= 4


# -- docs/architecture.md ------------------------------------------------------------------------

def test_architecture_sections() -> None:
    headings = re.findall(r"^## (.+)$", ARCHITECTURE, re.M)
    for required in ("Package layout", "The configuration object", "Golden model", "Gateware", "Compiler"):
        assert required in headings, required
    assert any("queues" in h.lower() and "tokens" in h.lower() for h in headings)
