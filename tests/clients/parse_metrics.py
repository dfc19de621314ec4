"""parse_metrics.py: reads an OpenMetrics exposition on stdin with Prometheus's own Python parser
(prometheus_client.openmetrics.parser, strict: one EOF, typed families, valid names and labels)
and prints each sample as a JSON line: {"name": ..., "labels": {...}, "value": ...}. A text the
parser refuses exits 2 with its reason.
"""

import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families


def main():
    text = sys.stdin.read()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                print(json.dumps({"name": sample.name, "labels": sample.labels, "value": sample.value}))
    except ValueError as error:
        print(f"parse_metrics: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
