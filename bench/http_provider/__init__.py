"""The HTTP-provider bench (issue 15): 1,000+ chunks through the real indexing steps at a provider limit."""

FOOTER = "This document is placed in the public domain or under the CC0-1.0-Universal license."


def document(n: int, paragraphs: int) -> bytes:
    """Policy ``n``: ``paragraphs`` unique paragraphs and a footer every document shares (embedded once)."""
    body = [f"# Policy {n}"]
    body += [f"Rule {n}.{i}: refunds for order class {n * 100 + i} are paid within {i % 9 + 3} days to the "
             f"original payment method, unless region {n}-{i} requires a bank transfer." for i in range(paragraphs)]
    return "\n\n".join([*body, FOOTER]).encode()
