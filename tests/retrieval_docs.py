"""Documents for the retrieval tests: six topics (two long enough for several chunks, one a PDF), the
questions that paraphrase each, and a one-page PDF written by hand (pypdf reads PDFs; writing one with
text needs a font and a content stream, which this does in ~20 lines)."""

from __future__ import annotations

# The long ones repeat varied sentences: several chunks at the default model's 254-token window.
DOCUMENTS = {
    "volcanoes.md": "# Volcanoes\n\nA volcano is an opening in the crust of a planet through which molten rock, "
                    "ash and gases escape. Magma rises from the mantle and erupts as lava. " + " ".join(
                        f"Eruption {k} of the stratovolcano sent ash columns {k + 3} kilometres high and lava "
                        f"flows reached the valley after {k + 1} days." for k in range(40)),
    "sourdough.txt": "Sourdough bread is leavened by a starter of wild yeast and lactic acid bacteria. Feed the "
                     "starter with flour and water, let the dough ferment slowly overnight, then bake it in a very "
                     "hot oven until the crust is dark and crisp.",
    "orbits.html": "<html><head><title>Orbits</title><script>var secret = 'do not index';</script></head><body>"
                   "<h1>Orbital mechanics</h1><p>Satellites stay in orbit around the Earth because their speed "
                   "balances the pull of gravity. A geostationary satellite circles once a day.</p></body></html>",
    "tennis.pdf": "Tennis is played with a racket and a felt ball on a court divided by a net. A player wins a "
                  "point when the opponent cannot return the ball. Wimbledon is played on grass.",
    "photosynthesis.md": "Photosynthesis lets plants turn sunlight, water and carbon dioxide into glucose and "
                         "oxygen. Chlorophyll in the leaves absorbs the light. " + " ".join(
                             f"In experiment {k} the leaves under {k * 10} percent shade produced {100 - k} units "
                             f"of oxygen from chlorophyll and sunlight." for k in range(40)),
    "jazz.txt": "Jazz music began in New Orleans. Musicians improvise melodies over chord changes, and the "
                "saxophone and trumpet lead the band while the drums keep swing rhythm.",
}
# Paraphrased questions, each with the document that answers it.
QUESTIONS = [
    ("Why does molten rock come out of mountains?", "volcanoes.md"),
    ("How do I bake bread with a wild yeast starter?", "sourdough.txt"),
    ("What keeps a satellite circling the planet?", "orbits.html"),
    ("How does someone score a point with a racket?", "tennis.pdf"),
    ("How do green plants make sugar from light?", "photosynthesis.md"),
    ("Where did improvised saxophone music start?", "jazz.txt"),
]


def pdf_bytes(text: str) -> bytes:
    """A one-page PDF showing `text` in Helvetica, wrapped at about 80 characters a line."""
    words, lines, line = text.split(), [], ""
    for word in words:
        if len(line) + len(word) > 80:
            lines.append(line)
            line = ""
        line = f"{line} {word}".strip()
    lines.append(line)
    escaped = [ln.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for ln in lines]
    stream = "BT /F1 11 Tf 50 750 Td 14 TL " + " ".join(f"({ln}) '" for ln in escaped) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        "/Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for k, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{k} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def upload_files() -> list[tuple[str, bytes]]:
    """The six documents as the openai SDK uploads them."""
    return [(name, pdf_bytes(text) if name.endswith(".pdf") else text.encode()) for name, text in DOCUMENTS.items()]
