"""The frame decoder against the hex examples of docs/hub-protocol.md (read from the doc, not
copied), and against malformed input."""
import os
import re
import unittest

from support import ROOT
import pgsse_hub as h

DOC = os.path.join(ROOT, "docs", "hub-protocol.md")
TYPES = {v: k for k, v in h.TYPE_NAMES.items()}
ACKS = {v: k for k, v in h.ACK_CODES.items()}
STATUSES = {v: k for k, v in h.STATUS_CODES.items()}


def doc_examples():
    """(description, bytes) for each row of the 'Worked example (hex)' table."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Worked example (hex)", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[1].startswith("`"):
            continue
        rows.append((cells[0], bytes.fromhex("".join(re.findall(r"`([0-9a-f]+)`", cells[1])))))
    session = re.findall(r"(sends|reads) `([0-9a-f]+)`", section)
    return rows, [(verb, bytes.fromhex(hx)) for verb, hx in session]


def expected(desc):
    """The Frame a row's description names: 'SUB req 7, lossless, `jobs`'."""
    words = desc.split()
    t = TYPES[words[0]]
    f = {"type": t}
    for key in ("req", "pid", "token", "version"):
        m = re.search(rf"\b{key} (\d+)", desc)
        if m:
            f[key] = int(m.group(1))
    if "lossless" in words or "lossless," in words:
        f["mode"] = h.LOSSLESS
    if "wake," in words or "wake" in words:
        f["mode"] = h.WAKE
    codes = ACKS if t == h.ACK else STATUSES if t == h.STATUS else {}
    for name, code in codes.items():
        if re.search(rf"\b{name}\b", desc):
            f["code"] = code
    for label, value in re.findall(r"(\w+)? ?`([^`]*)`", desc):
        value = value.encode()
        if label == "name":
            f["name"] = value
        elif label in ("payload", "text"):
            f["text"] = value
        elif t == h.ACK:
            f["text"] = value      # ACK's rest is its message
        else:
            f["channel"] = value
    if t == h.HELLO:
        f.setdefault("version", 1)
    return h.Frame(**f)


class DocExamples(unittest.TestCase):
    def test_table_rows_decode_to_what_they_say(self):
        rows, _ = doc_examples()
        self.assertGreaterEqual(len(rows), 16, "rows of the hex table in docs/hub-protocol.md")
        seen = set()
        for desc, data in rows:
            with self.subTest(desc):
                want = expected(desc)
                f, n = h.decode(data)
                self.assertEqual(n, len(data), "one whole frame per row")
                self.assertEqual(f, want)
                self.assertEqual(h.encode(f), data, "re-encodes to the same bytes")
                # Frames arrive in arbitrary pieces: byte by byte gives the same frame once.
                d = h.Decoder()
                got = []
                for i in range(len(data)):
                    d.feed(data[i:i + 1])
                    fr = d.next()
                    if fr is not None:
                        got.append((i, fr))
                self.assertEqual(got, [(len(data) - 1, want)])
                seen.add((f.type, f.code if f.type in (h.ACK, h.STATUS) else None))
        for code in h.STATUS_CODES:
            self.assertIn((h.STATUS, code), seen, f"the doc shows STATUS {h.STATUS_CODES[code]}")

    def test_session_decodes_in_order(self):
        _, session = doc_examples()
        self.assertEqual([v for v, _ in session], ["sends", "reads", "sends", "reads", "reads"])
        types = [h.decode(b)[0].type for _, b in session]
        self.assertEqual(types, [h.HELLO, h.STATUS, h.SUB, h.ACK, h.NOTIFY])
        d = h.Decoder()
        d.feed(b"".join(b for v, b in session if v == "reads"))
        self.assertEqual([d.next().type, d.next().type, d.next().type, d.next()], [h.STATUS, h.ACK, h.NOTIFY, None])
        notify = h.decode(session[-1][1])[0]
        self.assertEqual((notify.channel, notify.text), (b"jobs", b"42"))


class Malformed(unittest.TestCase):
    CASES = [
        ("length 0", "00000000" "83", "length 0"),
        ("length over 65536", "00010001" "83", "length 65537"),
        ("unknown type", "00000001" "7f", "unknown frame type 0x7f"),
        ("ACK cut short", "00000003" "81" "0000", "ends inside a field"),
        ("ACK code 5", "00000006" "81" "00000001" "05", "ACK code 5"),
        ("STATUS code 0", "00000003" "83" "00" "00", "STATUS code 0"),
        ("STATUS channel past the end", "00000004" "83" "03" "05" "6a", "ends inside a field"),
        ("NOTIFY channel empty", "00000007" "82" "00000001" "00" "78", "channel must be 1-63"),
        ("NOTIFY channel with NUL", "00000008" "82" "00000001" "02" "6100", "NUL"),
        ("PONG with trailing bytes", "0000000a" "84" "000000000000000101", "exactly a u64"),
        ("SUB mode 2", "00000007" "02" "00000001" "02" "61", "SUB mode 2"),
        ("HELLO version 2", "00000006" "01" "02" "00000001", "HELLO version 2"),
    ]

    def test_malformed_frames_are_protocol_errors(self):
        for name, hx, msg in self.CASES:
            with self.subTest(name):
                with self.assertRaises(h.ProtocolError) as cm:
                    h.decode(bytes.fromhex(hx))
                self.assertIn(msg, str(cm.exception))

    def test_incomplete_is_not_an_error(self):
        data = bytes.fromhex("0000000c8200007a69046a6f62733432")
        for i in range(len(data)):
            self.assertEqual(h.decode(data[:i]), (None, 0))


if __name__ == "__main__":
    unittest.main()
