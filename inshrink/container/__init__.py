"""The .ink container: header, records, index and tail (spec/FORMAT.md). Codec-agnostic."""
