#!/usr/bin/env python3
"""Checks the built book (mdBook's HTML) and README.md for links that lead nowhere.

Every relative href and src in every HTML page must name a file of the book, and its #fragment an
id on that page; every relative link in README.md must name a file of the repository, and its
#fragment a heading there. External links (a scheme, //host, mailto:) are not followed: the book is
read offline. Exit status 1, with each broken link and where it is, when any is broken.

Usage: check-book-links.py BOOK_DIR [README.md]
"""
import html.parser
import os
import re
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("id", "name"):
            if attrs.get(name):
                self.ids.add(attrs[name])
        for name in ("href", "src"):
            if attrs.get(name) is not None:
                self.links.append((tag, attrs[name], self.getpos()[0]))


def external(link):
    parsed = urllib.parse.urlsplit(link)
    return bool(parsed.scheme) or link.startswith("//")


def parse(path, cache={}):
    if path not in cache:
        page = Page()
        with open(path, encoding="utf-8") as file:
            page.feed(file.read())
        cache[path] = page
    return cache[path]


def check_book(root):
    broken, pages = [], 0
    for directory, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".html"):
                continue
            path = os.path.join(directory, name)
            pages += 1
            for tag, link, line in parse(path).links:
                # 404.html's <base href="/"> is where the book is served, not a link.
                if tag == "base" or not link or external(link) or link.startswith("javascript:"):
                    continue
                parts = urllib.parse.urlsplit(link)
                target = path
                if parts.path:
                    target = os.path.normpath(os.path.join(directory, urllib.parse.unquote(parts.path)))
                    if os.path.isdir(target):
                        target = os.path.join(target, "index.html")
                    if not os.path.isfile(target):
                        broken.append(f"{os.path.relpath(path, root)}:{line}: <{tag}> {link}: no such file")
                        continue
                if parts.fragment and target.endswith(".html"):
                    if urllib.parse.unquote(parts.fragment) not in parse(target).ids:
                        broken.append(f"{os.path.relpath(path, root)}:{line}: <{tag}> {link}: no such anchor")
    return broken, pages


def anchor(heading):
    """The anchor GitHub and mdBook give a Markdown heading."""
    text = re.sub(r"[`*_\[\]]|\]\([^)]*\)", "", heading.strip().lstrip("#").strip()).lower()
    return "".join("-" if c == " " else c for c in text if c.isalnum() or c in " -_")


def check_markdown(path):
    broken, base = [], os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as file:
        text = file.read()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for link in re.findall(r"\]\(([^)\s]+)\)", prose):
        if external(link):
            continue
        parts = urllib.parse.urlsplit(link)
        target = os.path.normpath(os.path.join(base, parts.path)) if parts.path else os.path.abspath(path)
        if not os.path.exists(target):
            broken.append(f"{path}: {link}: no such file")
        elif parts.fragment and target.endswith(".md"):
            with open(target, encoding="utf-8") as file:
                body = re.sub(r"```.*?```", "", file.read(), flags=re.S)
            anchors = {anchor(line) for line in body.splitlines() if line.startswith("#")}
            if parts.fragment not in anchors:
                broken.append(f"{path}: {link}: no such heading")
    return broken


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[-1])
    root = sys.argv[1]
    if not os.path.isfile(os.path.join(root, "index.html")):
        sys.exit(f"check-book-links: {root}/index.html is missing: build the book first (make docs)")
    broken, pages = check_book(root)
    if len(sys.argv) == 3:
        broken += check_markdown(sys.argv[2])
    for line in broken:
        print(f"check-book-links: {line}", file=sys.stderr)
    if broken:
        sys.exit(1)
    print(f"check-book-links: {pages} pages, every relative link and anchor found")


if __name__ == "__main__":
    main()
