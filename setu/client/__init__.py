"""Setu's producer client: HTTP produce and streaming produce (docs/streaming.md).

Standard library only, so it installs without the server's dependencies:

- :class:`HttpClient`: single and batch produce with retries that reuse ids, and
  :meth:`HttpClient.producer` for a producer that resumes after its last sequence id;
- :class:`AsyncStreamProducer` and :class:`StreamProducer`: one stream over the streaming
  protocol, with credits, reconnects and resume handled.
"""

from setu.client.errors import HttpError, SetuClientError, StreamError
from setu.client.http import HttpClient, Message, SequencedProducer
from setu.client.stream import AsyncStreamProducer, Backoff, StreamProducer

__all__ = [
    "AsyncStreamProducer",
    "Backoff",
    "HttpClient",
    "HttpError",
    "Message",
    "SequencedProducer",
    "SetuClientError",
    "StreamError",
    "StreamProducer",
]
