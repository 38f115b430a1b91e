"""A small terminal emulator for tests: what a person would see after a program wrote ``data`` to a terminal.

It keeps a screen of ``rows`` lines and the scrollback above it; understands printable text, CR, LF (the pty
already turned \\n into \\r\\n), backspace, autowrap, and the CSI sequences that rich and the console use
(cursor up/down/forward/back/column/position, erase in display and in line); colours and modes are ignored.
Lines that scrolled into the scrollback can no longer be changed, as on a real terminal.
"""

from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[([0-9;?]*)([ -/]*)([@-~])")
_OTHER_ESC = re.compile(r"\x1b[@-Z\\-_]|\x1b[()][0-9A-Za-z]")


class Terminal:
    def __init__(self, cols: int = 100, rows: int = 30) -> None:
        self.cols, self.rows = cols, rows
        self.scrollback: list[str] = []
        self.screen: list[list[str]] = [[] for _ in range(rows)]
        self.r = self.c = 0
        self._wrap = False  # the cursor stands past the last column: the next character wraps

    def feed(self, data: str) -> None:
        i = 0
        while i < len(data):
            ch = data[i]
            if ch == "\x1b":
                m = _CSI.match(data, i)
                if m:
                    self._csi(m.group(1), m.group(3))
                    i = m.end()
                    continue
                m = _OTHER_ESC.match(data, i)
                i = m.end() if m else i + 1
                continue
            if ch == "\r":
                self.c, self._wrap = 0, False
            elif ch == "\n":
                self._line_feed()
            elif ch == "\b":
                self.c, self._wrap = max(0, self.c - 1), False
            elif ch == "\t":
                self.c = min(self.cols - 1, (self.c // 8 + 1) * 8)
            elif ord(ch) >= 32:
                self._put(ch)
            i += 1

    def lines(self) -> list[str]:
        """Scrollback and screen, right-trimmed, without the empty lines at the bottom."""
        out = self.scrollback + ["".join(line).rstrip() for line in self.screen]
        while out and not out[-1]:
            out.pop()
        return out

    def _put(self, ch: str) -> None:
        if self._wrap:
            self.c, self._wrap = 0, False
            self._line_feed()
        line = self.screen[self.r]
        if len(line) <= self.c:
            line.extend(" " * (self.c - len(line) + 1))
        line[self.c] = ch
        if self.c == self.cols - 1:
            self._wrap = True
        else:
            self.c += 1

    def _line_feed(self) -> None:
        if self.r == self.rows - 1:
            self.scrollback.append("".join(self.screen.pop(0)).rstrip())
            self.screen.append([])
        else:
            self.r += 1

    def _csi(self, params: str, final: str) -> None:
        if params.startswith("?"):
            return  # modes (cursor shown or hidden)
        nums = [int(p) if p else 0 for p in params.split(";")] if params else []
        n = nums[0] if nums else 0
        self._wrap = False
        if final == "A":
            self.r = max(0, self.r - max(n, 1))
        elif final == "B":
            self.r = min(self.rows - 1, self.r + max(n, 1))
        elif final == "C":
            self.c = min(self.cols - 1, self.c + max(n, 1))
        elif final == "D":
            self.c = max(0, self.c - max(n, 1))
        elif final == "G":
            self.c = min(self.cols - 1, max(n, 1) - 1)
        elif final in "Hf":
            self.r = min(self.rows - 1, max(nums[0] if nums else 1, 1) - 1)
            self.c = min(self.cols - 1, max(nums[1] if len(nums) > 1 else 1, 1) - 1)
        elif final == "J":
            if n == 0:
                del self.screen[self.r][self.c:]
                for row in range(self.r + 1, self.rows):
                    self.screen[row] = []
            elif n == 1:
                for row in range(self.r):
                    self.screen[row] = []
                self._blank(0, self.c + 1)
            else:
                self.screen = [[] for _ in range(self.rows)]
        elif final == "K":
            if n == 0:
                del self.screen[self.r][self.c:]
            elif n == 1:
                self._blank(0, self.c + 1)
            else:
                self.screen[self.r] = []

    def _blank(self, start: int, end: int) -> None:
        line = self.screen[self.r]
        for col in range(start, min(end, len(line))):
            line[col] = " "
