"""A small line-plot rasterizer that writes PNG files with the standard library only (zlib, struct).

Used for the loss curve of the demo model, so the training machine needs no plotting package.
line_plot() draws axes with tick labels, one polyline per series and a legend, using a built-in
3x5 pixel font (digits, a few punctuation marks and lower-case letters), scaled up.
"""

import math
import struct
import zlib

# 3x5 glyphs, rows top to bottom, '#' = ink
_FONT_ROWS = {
    "0": ["###", "#.#", "#.#", "#.#", "###"], "1": [".#.", "##.", ".#.", ".#.", "###"],
    "2": ["###", "..#", "###", "#..", "###"], "3": ["###", "..#", "###", "..#", "###"],
    "4": ["#.#", "#.#", "###", "..#", "..#"], "5": ["###", "#..", "###", "..#", "###"],
    "6": ["###", "#..", "###", "#.#", "###"], "7": ["###", "..#", ".#.", ".#.", ".#."],
    "8": ["###", "#.#", "###", "#.#", "###"], "9": ["###", "#.#", "###", "..#", "###"],
    ".": ["...", "...", "...", "...", ".#."], "-": ["...", "...", "###", "...", "..."],
    ":": ["...", ".#.", "...", ".#.", "..."], "/": ["..#", "..#", ".#.", "#..", "#.."], " ": ["...", "...", "...", "...", "..."],
    "(": [".#.", "#..", "#..", "#..", ".#."], ")": [".#.", "..#", "..#", "..#", ".#."],
    "a": ["...", "##.", "..#", "###", "###"], "b": ["#..", "#..", "###", "#.#", "###"],
    "c": ["...", "###", "#..", "#..", "###"], "d": ["..#", "..#", "###", "#.#", "###"],
    "e": ["...", "###", "###", "#..", "###"], "f": [".##", "#..", "###", "#..", "#.."],
    "g": ["###", "#.#", "###", "..#", "##."], "h": ["#..", "#..", "###", "#.#", "#.#"],
    "i": [".#.", "...", ".#.", ".#.", ".#."], "k": ["#..", "#.#", "##.", "#.#", "#.#"],
    "l": ["##.", ".#.", ".#.", ".#.", "###"], "m": ["...", "###", "###", "#.#", "#.#"],
    "n": ["...", "##.", "#.#", "#.#", "#.#"], "o": ["...", "###", "#.#", "#.#", "###"],
    "p": ["...", "###", "#.#", "###", "#.."], "r": ["...", "###", "#..", "#..", "#.."],
    "s": ["...", "###", "##.", "..#", "###"], "t": [".#.", "###", ".#.", ".#.", ".##"],
    "u": ["...", "#.#", "#.#", "#.#", "###"], "v": ["...", "#.#", "#.#", "#.#", ".#."],
    "w": ["...", "#.#", "###", "###", "###"], "x": ["...", "#.#", ".#.", "#.#", "#.#"],
    "y": ["...", "#.#", "###", "..#", "##."],
}

WHITE = (255, 255, 255)
BLACK = (0, 0, 0)
GREY = (220, 220, 220)


def write_png(path, width, height, pixels):
    """pixels: bytearray of width*height*3 RGB bytes, rows top to bottom."""
    raw = bytearray()
    stride = width * 3
    for y in range(height):
        raw.append(0)  # filter type: none
        raw += pixels[y * stride:(y + 1) * stride]

    def chunk(tag, data):
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n"
    png += chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(bytes(raw), 9))
    png += chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


class Canvas:
    def __init__(self, width, height, background=WHITE):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x, y, color):
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i:i + 3] = bytes(color)

    def rect(self, x0, y0, x1, y1, color):
        for y in range(max(0, y0), min(self.height, y1 + 1)):
            for x in range(max(0, x0), min(self.width, x1 + 1)):
                self.set(x, y, color)

    def line(self, x0, y0, x1, y1, color, thickness=1):
        """Bresenham, with a square brush of the given thickness."""
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        lo, hi = -((thickness - 1) // 2), thickness // 2
        while True:
            for oy in range(lo, hi + 1):
                for ox in range(lo, hi + 1):
                    self.set(x0 + ox, y0 + oy, color)
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, color=BLACK, scale=2):
        """Draws s with its top-left corner at (x, y); unknown characters are drawn as blanks."""
        for ch in s.lower():
            rows = _FONT_ROWS.get(ch, _FONT_ROWS[" "])
            for r, row in enumerate(rows):
                for c, cell in enumerate(row):
                    if cell == "#":
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale - 1, y + (r + 1) * scale - 1, color)
            x += 4 * scale

    @staticmethod
    def text_width(s, scale=2):
        return len(s) * 4 * scale - scale


def nice_ticks(lo, hi, count=5):
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        if t >= lo - step * 1e-9:
            ticks.append(t)
        t += step
    return ticks, step


def _fmt(v, step):
    if step >= 1 and float(step).is_integer():
        return str(int(round(v)))
    digits = 1 if step >= 1 else max(1, -int(math.floor(math.log10(step))) + (0 if (step * 10 ** -math.floor(math.log10(step))).is_integer() else 1))
    return f"{v:.{digits}f}"


def line_plot(path, series, title="", xlabel="", ylabel="", width=900, height=560, ylim=None):
    """series: list of (label, xs, ys, (r, g, b)). Writes a PNG to path."""
    cv = Canvas(width, height)
    left, right, top, bottom = 80, 20, 40, 60
    pw, ph = width - left - right, height - top - bottom

    xs_all = [x for _, xs, _, _ in series for x in xs]
    ys_all = [y for _, _, ys, _ in series for y in ys if math.isfinite(y)]
    if not xs_all or not ys_all:
        xs_all, ys_all = [0, 1], [0, 1]
    x_lo, x_hi = 0, max(xs_all) if max(xs_all) > 0 else 1
    y_lo, y_hi = ylim if ylim else (min(ys_all), max(ys_all))
    if y_hi <= y_lo:
        y_hi = y_lo + 1
    pad = (y_hi - y_lo) * 0.05
    y_lo, y_hi = y_lo - pad, y_hi + pad

    def px(x):
        return left + (x - x_lo) / (x_hi - x_lo) * pw

    def py(y):
        y = min(max(y, y_lo), y_hi)
        return top + ph - (y - y_lo) / (y_hi - y_lo) * ph

    yt, ystep = nice_ticks(y_lo, y_hi)
    for t in yt:
        yy = int(round(py(t)))
        cv.line(left, yy, left + pw, yy, GREY)
        label = _fmt(t, ystep)
        cv.text(left - 8 - Canvas.text_width(label), yy - 5, label)
    xt, xstep = nice_ticks(x_lo, x_hi)
    for t in xt:
        xx = int(round(px(t)))
        cv.line(xx, top, xx, top + ph, GREY)
        label = _fmt(t, xstep)
        cv.text(xx - Canvas.text_width(label) // 2, top + ph + 8, label)
    cv.line(left, top, left, top + ph, BLACK)
    cv.line(left, top + ph, left + pw, top + ph, BLACK)

    for _, xs, ys, color in series:
        pts = [(px(x), py(y)) for x, y in zip(xs, ys) if math.isfinite(y)]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            cv.line(x0, y0, x1, y1, color, thickness=2)
        if len(pts) <= 60:
            for x, y in pts:
                cv.rect(int(x) - 2, int(y) - 2, int(x) + 2, int(y) + 2, color)

    if title:
        cv.text(left + (pw - Canvas.text_width(title, 3)) // 2, 8, title, scale=3)
    if xlabel:
        cv.text(left + (pw - Canvas.text_width(xlabel)) // 2, height - 22, xlabel)
    if ylabel:
        cv.text(6, top - 22, ylabel)
    ly = top + 10
    for label, _, _, color in series:
        lx = left + pw - 170
        cv.rect(lx, ly + 3, lx + 24, ly + 6, color)
        cv.text(lx + 32, ly, label)
        ly += 18
    write_png(path, width, height, cv.pixels)
