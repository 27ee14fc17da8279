#!/usr/bin/env python3
"""parquet_ref.py — Parquet files for tests/sh/test_data_parquet.sh (test-only).

  parquet_ref.py valid OUT MOBY       pyarrow-written files and their .jsonl twins
  parquet_ref.py malformed OUT GOOD   broken files, one per line of OUT/expect.tsv
  parquet_ref.py bench OUT MOBY MB    a FineWeb-shaped file of about MB megabytes of text
  parquet_ref.py seeds OUT MOBY       small files of every kind, the fuzzer's seeds

valid: every file X.parquet has X.jsonl beside it with the same documents in the same
order ({"text": value}, a null written as ""), so `tetra data prepare` must give both the
same token shards. The texts are Moby Dick's paragraphs plus empty strings, nulls,
non-ASCII and repeated values (so dictionaries are used).

malformed: byte surgery on a pyarrow file (magic, footer), and files from a small writer
here that follows parquet.thrift and the Thrift compact protocol, for what pyarrow will
not write (bad page sizes, dictionary indices out of range, decompression bombs, bad
CRCs, invalid UTF-8). Each line of expect.tsv is FILE<TAB>COLUMN<TAB>what the error must
say. The writer's well-formed output is read back with pyarrow first, so the writer
itself is checked against an independent reader.
"""
import json
import os
import struct
import sys
import zlib

import pyarrow as pa
import pyarrow.parquet as pq


def paragraphs(moby, n):
    text = open(moby, encoding="utf-8").read()
    paras = [p.strip() for p in text.split("\n\n") if p.strip()]
    return paras[:n]


def corpus(moby, n=420):
    rows = paragraphs(moby, n)
    # empties, nulls, non-ASCII, duplicates (dictionary hits), a long value
    rows[3] = ""
    rows[7] = None
    rows[11] = "Caf\u00e9 \u2014 the whale \U0001F40B, \u00bfs\u00ed?"
    rows[12] = None
    rows += rows[20:60]
    rows.append(" ".join(paragraphs(moby, 200)[100:200]))
    rows.append(None)
    return rows


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({"text": r if r is not None else ""}, ensure_ascii=False) + "\n")


def valid(out, moby):
    os.makedirs(out, exist_ok=True)
    rows = corpus(moby)
    table = pa.table({"text": pa.array(rows, pa.string())})
    # every codec x page version x dictionary / plain, several row groups and pages each
    for codec in ["none", "snappy", "gzip", "zstd"]:
        for version in ["1.0", "2.0"]:
            for dic in [True, False]:
                name = "%s_v%s_%s" % (codec, version[0], "dict" if dic else "plain")
                pq.write_table(table, os.path.join(out, name + ".parquet"), compression=codec,
                               data_page_version=version, use_dictionary=dic, row_group_size=97,
                               data_page_size=4096)
                write_jsonl(os.path.join(out, name + ".jsonl"), rows)
    # a dictionary that overflows its page limit: dictionary pages, then PLAIN pages
    pq.write_table(table, os.path.join(out, "dict_fallback.parquet"), compression="snappy",
                   dictionary_pagesize_limit=6000, row_group_size=300, data_page_size=2048)
    write_jsonl(os.path.join(out, "dict_fallback.jsonl"), rows)
    # page CRCs recorded, and a column that may not be null
    pq.write_table(table, os.path.join(out, "checksums.parquet"), compression="zstd", write_page_checksum=True,
                   row_group_size=150)
    write_jsonl(os.path.join(out, "checksums.jsonl"), rows)
    req = [r if r is not None else "" for r in rows]
    schema = pa.schema([pa.field("text", pa.string(), nullable=False)])
    pq.write_table(pa.table({"text": req}, schema=schema), os.path.join(out, "required.parquet"), row_group_size=128)
    write_jsonl(os.path.join(out, "required.jsonl"), req)
    # FineWeb's schema (text first, then id, dump, url, date, file_path, language, scores)
    n = len(rows)
    fineweb = pa.table({
        "text": pa.array(rows, pa.string()),
        "id": ["<urn:uuid:%08x-0000-4000-8000-%012x>" % (i, i * 7919) for i in range(n)],
        "dump": ["CC-MAIN-2024-10"] * n,
        "url": ["https://example.org/whale/%d" % i for i in range(n)],
        "date": ["2024-02-%02dT12:00:00Z" % (1 + i % 28) for i in range(n)],
        "file_path": ["s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/%d.warc.gz" % (i % 5) for i in range(n)],
        "language": ["en"] * n,
        "language_score": [0.9 + (i % 10) / 100 for i in range(n)],
        "token_count": pa.array([len(r or "") // 4 for r in rows], pa.int64()),
    })
    pq.write_table(fineweb, os.path.join(out, "fineweb.parquet"), compression="zstd", row_group_size=100)
    write_jsonl(os.path.join(out, "fineweb.jsonl"), rows)
    # the text after nested and list columns: its chunk is found by its place among the leaves
    nested = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "meta": pa.array([{"a": "x%d" % i, "b": [i, i + 1]} for i in range(n)]),
        "tags": pa.array([["t%d" % (i % 3)] * (i % 4) for i in range(n)]),
        "content": pa.array(rows, pa.string()),
        "score": pa.array([i / 7 for i in range(n)], pa.float64()),
    })
    pq.write_table(nested, os.path.join(out, "nested.parquet"), compression="gzip", row_group_size=111)
    write_jsonl(os.path.join(out, "nested.jsonl"), rows)
    # one document in all: cut in two for the val split, like a one-line .jsonl
    one = [" ".join(paragraphs(moby, 40))]
    pq.write_table(pa.table({"text": one}), os.path.join(out, "single.parquet"))
    write_jsonl(os.path.join(out, "single.jsonl"), one)
    # several files: a folder of Parquet files and a folder of their .jsonl twins
    for k, (a, b) in enumerate([(0, 150), (150, 300), (300, len(rows))]):
        for d in ["multi_pq", "multi_jl"]:
            os.makedirs(os.path.join(out, d), exist_ok=True)
        part = rows[a:b]
        pq.write_table(pa.table({"text": pa.array(part, pa.string())}),
                       os.path.join(out, "multi_pq", "part-%05d.parquet" % k), compression="snappy", row_group_size=64)
        write_jsonl(os.path.join(out, "multi_jl", "part-%05d.jsonl" % k), part)
    # refused: a codec and an encoding the reader does not decode
    pq.write_table(table, os.path.join(out, "lz4.parquet"), compression="lz4")
    pq.write_table(table, os.path.join(out, "delta.parquet"), use_dictionary=False,
                   column_encoding={"text": "DELTA_BYTE_ARRAY"})
    print("wrote %d rows into each of the valid files in %s" % (len(rows), out))


# ---- a small Parquet writer, for files pyarrow will not write ----------------------------

def varint(n):
    b = bytearray()
    while True:
        x = n & 0x7F
        n >>= 7
        if n:
            b.append(x | 0x80)
        else:
            b.append(x)
            return bytes(b)


def zz(n):
    return (n << 1) ^ (n >> 63)


class Thrift:
    """Thrift compact protocol writer: fields, nested structs and lists."""

    def __init__(self):
        self.b = bytearray()
        self.last = [0]

    def field(self, fid, t):
        d = fid - self.last[-1]
        if 0 < d <= 15:
            self.b.append(d << 4 | t)
        else:
            self.b.append(t)
            self.b += varint(zz(fid))
        self.last[-1] = fid

    def i32(self, fid, v):
        self.field(fid, 5)
        self.b += varint(zz(v))

    def i64(self, fid, v):
        self.field(fid, 6)
        self.b += varint(zz(v))

    def string(self, fid, s):
        self.field(fid, 8)
        s = s.encode() if isinstance(s, str) else s
        self.b += varint(len(s)) + s

    def boolean(self, fid, v):
        self.field(fid, 1 if v else 2)

    def begin(self, fid=None):  # a struct field, or a list element when fid is None
        if fid is not None:
            self.field(fid, 12)
        self.last.append(0)

    def end(self):
        self.b.append(0)
        self.last.pop()

    def list(self, fid, etype, n):
        self.field(fid, 9)
        self.b += bytes([n << 4 | etype]) if n < 15 else bytes([0xF0 | etype]) + varint(n)


def plain(values):
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def rle_runs(vals, bw):
    """The RLE / bit-packed hybrid as one RLE run per value (valid, if not compact)."""
    nb = (bw + 7) // 8
    return b"".join(varint(2) + v.to_bytes(nb, "little") for v in vals)


def bitpacked_bits(vals):
    """Width-1 values as one bit-packed run (groups of 8, least significant bit first)."""
    groups = (len(vals) + 7) // 8
    out = bytearray(groups)
    for i, v in enumerate(vals):
        out[i // 8] |= (v & 1) << (i % 8)
    return varint(groups << 1 | 1) + bytes(out)


def compress(codec, data):
    if codec == 0:
        return data
    name = {1: "snappy", 2: "gzip", 6: "zstd"}[codec]
    return pa.compress(data, codec=name, asbytes=True)


def page(ptype, raw_len, stored, sub, crc=None, **over):
    """PageHeader + stored bytes. sub = (field id, [(kind, fid, value)...]); over replaces
    uncompressed_page_size (usize) or compressed_page_size (csize)."""
    t = Thrift()
    t.i32(1, ptype)
    t.i32(2, over.get("usize", raw_len))
    t.i32(3, over.get("csize", len(stored)))
    if crc is not None:
        t.i32(4, crc)
    fid, fields = sub
    t.begin(fid)
    for kind, f, v in fields:
        getattr(t, kind)(f, v)
    t.end()
    t.end()
    return bytes(t.b) + stored


def dict_page(values, codec, **over):
    raw = plain(values)
    return page(2, len(raw), compress(codec, raw), (7, [("i32", 1, len(values)), ("i32", 2, 0)]), **over)


def v1_page(levels, body, codec, enc=0, def_bytes=None, crc=False, bad_crc=False, **over):
    """A data page v1: definition levels (RLE, with their 4-byte length) then values."""
    lv = def_bytes if def_bytes is not None else rle_runs(levels, 1)
    raw = struct.pack("<I", len(lv)) + lv + body
    stored = compress(codec, raw)
    c = None
    if crc or bad_crc:
        c = zlib.crc32(stored) ^ (1 if bad_crc else 0)
        c = c - (1 << 32) if c >= 1 << 31 else c
    return page(0, len(raw), stored, (5, [("i32", 1, len(levels)), ("i32", 2, enc), ("i32", 3, 3), ("i32", 4, 3)]),
                crc=c, **over)


def v2_page(levels, body, codec, enc=0, **over):
    lv = rle_runs(levels, 1)
    nulls = levels.count(0)
    stored = lv + compress(codec, body)
    return page(3, len(lv) + len(body), stored,
                (8, [("i32", 1, len(levels)), ("i32", 2, over.pop("nulls", nulls)), ("i32", 3, len(levels)),
                     ("i32", 4, enc), ("i32", 5, len(lv)), ("i32", 6, 0)]), **over)


def write_file(path, pages, num_rows, codec, total_uncompressed=None, has_dict=False):
    """PAR1, the pages as one column chunk of one row group, the footer, PAR1."""
    chunk = b"".join(pages)
    start = 4
    data_off = start + (len(pages[0]) if has_dict else 0)
    t = Thrift()
    t.i32(1, 1)
    t.list(2, 12, 2)
    t.begin(); t.string(4, "schema"); t.i32(5, 1); t.end()
    t.begin(); t.i32(1, 6); t.i32(3, 1); t.string(4, "text"); t.i32(6, 0); t.end()
    t.i64(3, num_rows)
    t.list(4, 12, 1)
    t.begin()  # RowGroup
    t.list(1, 12, 1)
    t.begin()  # ColumnChunk
    t.i64(2, 0)
    t.begin(3)  # ColumnMetaData
    t.i32(1, 6)
    t.list(2, 5, 3)
    t.b += varint(zz(0)) + varint(zz(3)) + varint(zz(8))
    t.list(3, 8, 1)
    t.b += varint(4) + b"text"
    t.i32(4, codec)
    t.i64(5, num_rows)
    t.i64(6, total_uncompressed if total_uncompressed is not None else len(chunk) * 4 + (1 << 20))
    t.i64(7, len(chunk))
    t.i64(9, data_off)
    if has_dict:
        t.i64(11, start)
    t.end()
    t.end()  # ColumnChunk
    t.i64(2, len(chunk))
    t.i64(3, num_rows)
    t.end()  # RowGroup
    t.string(6, "tetra tests/py/parquet_ref.py")
    t.end()
    footer = bytes(t.b)
    with open(path, "wb") as f:
        f.write(b"PAR1" + chunk + footer + struct.pack("<I", len(footer)) + b"PAR1")


def malformed(out, good):
    os.makedirs(out, exist_ok=True)
    expect = []

    def add(name, data, col, want):
        p = os.path.join(out, name)
        if data is not None:
            open(p, "wb").write(data)
        expect.append((name, col, want))

    g = open(good, "rb").read()
    flen = struct.unpack_from("<I", g, len(g) - 8)[0]
    add("magic_start.parquet", b"PAR0" + g[4:], "text", "not a Parquet file (wrong magic")
    add("magic_end.parquet", g[:-4] + b"PARX", "text", "not a Parquet file (wrong magic")
    add("truncated.parquet", g[:-100], "text", "not a Parquet file (wrong magic")
    add("tiny.parquet", b"PAR1PAR1", "text", "not a Parquet file (8 bytes")
    add("footer_len.parquet", g[:-8] + struct.pack("<I", len(g)) + b"PAR1", "text", "footer length")
    # the footer's first half cut out: its length now points into the data
    cut = g[:len(g) - 8 - flen] + g[len(g) - 8 - flen // 2:-8] + struct.pack("<I", flen) + b"PAR1"
    add("footer_cut.parquet", cut, "text", "corrupt footer")
    # the footer cut short at its end (its length says how much there is)
    add("footer_short.parquet", g[:len(g) - 8 - flen] + g[len(g) - 8 - flen:len(g) - 8 - flen // 3] +
        struct.pack("<I", flen - flen // 3) + b"PAR1", "text", "corrupt footer")
    add("encrypted.parquet", g[:-4] + b"PARE", "text", "unsupported: an encrypted Parquet file")
    add("good.parquet", g, "body", "no column 'body'")

    texts = [b"Call me Ishmael.", b"", b"Some years ago.", b"never mind how long"]
    levels = [1, 1, 0, 1, 1]
    body = plain(texts)
    # the writer's own output first: pyarrow must read it, and tetra too (checked by the test)
    ok = [("ok_v1_none.parquet", [v1_page(levels, body, 0)], 0, False),
          ("ok_v1_zstd_crc.parquet", [v1_page(levels, body, 6, crc=True)], 6, False),
          ("ok_v2_gzip.parquet", [v2_page(levels, body, 2)], 2, False),
          ("ok_dict_bitpacked.parquet", [dict_page([b"whale", b"sea"], 1),
                                          v1_page(levels, bytes([2]) + rle_runs([0, 1, 1, 0], 2), 1, enc=8,
                                                  def_bytes=bitpacked_bits(levels))], 1, True),
          ("ok_plain_dictionary.parquet", [dict_page([b"whale", b"sea"], 0),
                                           v2_page(levels, bytes([1]) + rle_runs([1, 0, 1, 1], 1), 0, enc=2)], 0, True)]
    for name, pages, codec, has_dict in ok:
        write_file(os.path.join(out, name), pages, len(levels), codec, has_dict=has_dict)
        got = pq.read_table(os.path.join(out, name)).column("text").to_pylist()
        assert len(got) == 5 and got[2] is None, (name, got)
        write_jsonl(os.path.join(out, name[:-8] + ".jsonl"), got)
        expect.append((name, "text", "OK"))

    def bad(name, pages, codec, want, rows=len(levels), **kw):
        write_file(os.path.join(out, name), pages, rows, codec, **kw)
        expect.append((name, "text", want))

    bad("page_too_long.parquet", [v1_page(levels, body, 0, csize=len(body) + 500)], 0, "are left in the chunk")
    bad("page_short.parquet", [v1_page(levels, body, 0, csize=10)], 0, "corrupt")
    bad("page_usize.parquet", [v1_page(levels, body, 0, usize=len(body) + 9)], 0, "declares")
    bad("page_negative.parquet", [v1_page(levels, body, 0, csize=-5)], 0, "corrupt")
    bad("value_too_long.parquet", [v1_page(levels, plain(texts)[:-3], 0)], 0, "runs past the end of the page")
    bad("too_many_values.parquet", [v1_page(levels + [1], plain(texts + [b"x"]), 0)], 0,
        "more than the 5 rows left")
    bad("too_few_values.parquet", [v1_page(levels[:3], plain(texts[:2]), 0)], 0,
        "pages hold 3 values but the row group has 5 rows")
    bad("levels_past_end.parquet", [v1_page(levels, body, 0, def_bytes=b"\x02\x01" * 2 + b"\xff\xff\xff\x7f")], 0,
        "corrupt")
    bad("dict_index.parquet", [dict_page([b"whale", b"sea"], 0),
                               v1_page(levels, bytes([3]) + rle_runs([0, 7, 1, 0], 3), 0, enc=8)], 0,
        "dictionary index 7 out of range", has_dict=True)
    bad("dict_missing.parquet", [v1_page(levels, bytes([1]) + rle_runs([0, 1, 1, 0], 1), 0, enc=8)], 0,
        "has no dictionary page")
    bad("bad_crc.parquet", [v1_page(levels, body, 6, bad_crc=True)], 6, "fails its CRC-32 check")
    bad("bad_utf8.parquet", [v1_page(levels, plain([b"fine", b"", b"caf\xff", b"x"]), 0)], 0,
        "row group 0, row 4: invalid UTF-8 at byte offset 3")
    bad("delta_v1.parquet", [v1_page(levels, body, 0, enc=6)], 0, "unsupported: value encoding DELTA_LENGTH_BYTE_ARRAY")
    bad("v2_nulls.parquet", [v2_page(levels, body, 0, nulls=3)], 0, "declares 3 nulls but its levels hold 1")
    # decompression bombs: 16 MiB of text that compresses to a few KiB, declared as less
    big = plain([b"a" * (16 << 20)] + texts[1:])
    for codec, cname in [(6, "zstd"), (2, "gzip"), (1, "snappy")]:
        bad("bomb_%s.parquet" % cname, [v1_page(levels, big, codec, usize=4096)], codec,
            "decompresses to more than the 4096 bytes its header declares")
    # a page that claims 2 GiB: refused before anything is inflated
    bad("bomb_declared.parquet", [v1_page(levels, body, 6, usize=(1 << 31) - 1)], 6,
        "declare more than the", total_uncompressed=4096)
    with open(os.path.join(out, "expect.tsv"), "w") as f:
        for name, col, want in expect:
            f.write("%s\t%s\t%s\n" % (name, col, want))
    print("wrote %d malformed and %d well-formed files into %s" % (len(expect) - len(ok), len(ok), out))


def seeds(out, moby):
    os.makedirs(out, exist_ok=True)
    rows = [p[:60] for p in paragraphs(moby, 14)]
    rows[2], rows[5], rows[9] = "", None, rows[1]
    table = pa.table({"text": pa.array(rows, pa.string())})
    for codec in ["none", "snappy", "gzip", "zstd"]:
        for version in ["1.0", "2.0"]:
            for dic in [True, False]:
                pq.write_table(table, os.path.join(out, "%s_%s_%d.parquet" % (codec, version, dic)), compression=codec,
                               data_page_version=version, use_dictionary=dic, row_group_size=5, data_page_size=64)
    pq.write_table(table, os.path.join(out, "crc.parquet"), write_page_checksum=True, row_group_size=7)
    pq.write_table(table, os.path.join(out, "fallback.parquet"), dictionary_pagesize_limit=100, data_page_size=64)
    n = len(rows)
    pq.write_table(pa.table({"id": pa.array(range(n), pa.int64()),
                             "meta": pa.array([{"a": "x", "b": [i]} for i in range(n)]),
                             "text": pa.array(rows, pa.string()), "score": [0.5] * n}),
                   os.path.join(out, "nested.parquet"), row_group_size=6)
    levels = [1, 1, 0, 1, 1]
    texts = [b"Call me Ishmael.", b"", b"Some years ago.", b"never"]
    write_file(os.path.join(out, "w_v1.parquet"), [v1_page(levels, plain(texts), 0)], 5, 0)
    write_file(os.path.join(out, "w_dict.parquet"), [dict_page([b"whale", b"sea"], 1),
               v1_page(levels, bytes([2]) + rle_runs([0, 1, 1, 0], 2), 1, enc=8, def_bytes=bitpacked_bits(levels))],
               5, 1, has_dict=True)
    write_file(os.path.join(out, "w_v2.parquet"), [v2_page(levels, plain(texts), 6)], 5, 6)
    print("wrote %d seeds into %s" % (len(os.listdir(out)), out))


def bench(out, moby, mb):
    rows, size, paras = [], 0, paragraphs(moby, 100000)
    i = 0
    while size < mb * 1e6:
        r = " ".join(paras[i % len(paras):i % len(paras) + 8]) + " %d" % i
        rows.append(r)
        size += len(r.encode())
        i += 8
    n = len(rows)
    t = pa.table({"text": rows, "id": ["id-%d" % k for k in range(n)], "url": ["https://x/%d" % k for k in range(n)],
                  "language_score": [0.9] * n})
    pq.write_table(t, out, compression="snappy", row_group_size=20000)
    print("%s: %d rows, %.1f MB of text" % (out, n, size / 1e6))


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "valid" and len(sys.argv) == 4:
        valid(sys.argv[2], sys.argv[3])
    elif cmd == "malformed" and len(sys.argv) == 4:
        malformed(sys.argv[2], sys.argv[3])
    elif cmd == "seeds" and len(sys.argv) == 4:
        seeds(sys.argv[2], sys.argv[3])
    elif cmd == "bench" and len(sys.argv) == 5:
        bench(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        sys.exit(__doc__)
