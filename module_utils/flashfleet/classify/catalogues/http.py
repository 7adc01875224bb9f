"""HTTP statuses of the services a run talks to (the Hugging Face hub, S3, W&B, a vLLM target
server), every 4xx and 5xx of Python's `http.HTTPStatus` (RFC 9110 and the registry it follows), and
S3's own error codes (Amazon S3 API Reference, "Error responses"). A status is spelt by the client
that got it: requests' `401 Client Error: Unauthorized for url: ...`, httpx's `Client error '401
Unauthorized' for url`, urllib's `HTTP Error 401: Unauthorized`, botocore's `An error occurred
(AccessDenied) when calling the GetObject operation`."""

from __future__ import annotations

import re
from http import HTTPStatus

from .entry import Entry

SOURCE = "RFC 9110 status codes, as Python's http.HTTPStatus lists them"
S3_SOURCE = "Amazon S3 API Reference: Error responses (error codes)"

_CREDENTIALS = ("crash", "fix-config", "the service refused the run's credentials (HF_TOKEN, WANDB_API_KEY, the "
                "S3 keys): set valid ones for the run's unit, or accept the model's licence (a gated repository)")
_RETRY = ("crash", "rerun", "the service failed or was overloaded: restart the run later; it resumes from the "
          "newest checkpoint")
MEANINGS = {
    401: _CREDENTIALS, 403: _CREDENTIALS, 407: ("crash", "check-network", "the host's proxy wants credentials"),
    404: ("crash", "fix-config", "the repository, file or bucket named does not exist (a wrong name or revision in "
               "the run's configuration, or a private repository without a token)"),
    408: ("crash", "check-network", "the service timed out waiting for the request"),
    413: ("crash", "fix-config", "the request is larger than the service accepts"),
    429: ("crash", "rerun", "the service rate-limited the run: retry later, or stage files locally"),
    500: _RETRY, 502: ("crash", "check-network", "a gateway or proxy between the host and the service failed"),
    503: _RETRY, 504: ("crash", "check-network", "a gateway or proxy timed out reaching the service"),
}


def _entry(status: HTTPStatus) -> Entry:
    code, phrase = int(status), status.phrase
    kind = "Client" if code < 500 else "Server"
    verdict, action, meaning = MEANINGS.get(code, ("crash", "investigate", f"the service answered {code} {phrase}"))
    pattern = re.compile(rf"\b{code} {kind} Error\b|{kind} error '{code}\b|HTTP Error {code}\b"
                         rf"|\bHTTP(?: status)? {code}\b|status(?: code)?[:=]? {code}\b")
    return Entry("http", f"HTTP {code}", pattern, f"HTTP {code} {phrase}: {meaning}", verdict, action, SOURCE,
                 f"requests.exceptions.HTTPError: {code} {kind} Error: {phrase} for url: "
                 "https://huggingface.co/api/models/example/model", number=code)


S3_CODES = {  # code: (HTTP status, verdict, action, meaning)
    "AccessDenied": (403, *_CREDENTIALS),
    "InvalidAccessKeyId": (403, *_CREDENTIALS),
    "SignatureDoesNotMatch": (403, "crash", "fix-config", "the S3 secret key does not match its access key id"),
    "ExpiredToken": (400, "crash", "fix-config", "the S3 session token expired: refresh the run's credentials"),
    "RequestTimeTooSkewed": (403, "crash", "fix-config", "the host's clock is too far from the S3 server's: sync "
                             "it (NTP)"),
    "NoSuchBucket": (404, "crash", "fix-config", "the bucket named does not exist"),
    "NoSuchKey": (404, "crash", "fix-config", "the object named does not exist (a wrong prefix or an unstaged file)"),
    "SlowDown": (503, "crash", "rerun", "S3 is throttling the run's requests: retry later, with fewer parallel "
                 "requests"),
    "InternalError": (500, *_RETRY),
}


def _s3_entry(code: str) -> Entry:
    status, verdict, action, meaning = S3_CODES[code]
    return Entry("s3", code, re.compile(rf"\({code}\) when calling|<Code>{code}</Code>"),
                 f"S3 {code} (HTTP {status}): {meaning}", verdict, action, S3_SOURCE,
                 f"botocore.exceptions.ClientError: An error occurred ({code}) when calling the GetObject operation: "
                 "see the code", number=status)


ENTRIES = (tuple(_entry(s) for s in HTTPStatus if 400 <= s < 600)
           + tuple(_s3_entry(c) for c in S3_CODES))
