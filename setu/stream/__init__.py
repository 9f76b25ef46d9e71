"""The streaming produce protocol (docs/design.md §11): its frames, shared by server and client."""
