"""Operator endpoints of a subscription's delivery: status, groups, dead letters, seek.

Routes are added by the delivery work; the app factory includes this router.
"""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
