"""Which settle modes the server refuses at attach (gateway/rules/settle_modes.py)."""

from __future__ import annotations

import pytest

from sluicegate.gateway.rules.settle_modes import refuse_unhonoured
from sluicegate.queues.errors import NotImplementedByServer

UNSETTLED, SETTLED, MIXED = 0, 1, 2
FIRST, SECOND = 0, 1


@pytest.mark.parametrize("snd", [UNSETTLED, SETTLED, MIXED])
@pytest.mark.parametrize("rcv", [FIRST, SECOND])
def test_a_consumer_may_attach_in_every_mode(snd: int, rcv: int) -> None:
    refuse_unhonoured(snd, rcv, server_sends=True, management=False)


@pytest.mark.parametrize("snd", [UNSETTLED, MIXED])
def test_a_receiving_link_refuses_rcv_second_unless_the_client_sends_settled(snd: int) -> None:
    with pytest.raises(NotImplementedByServer, match="rcv-settle-mode second"):
        refuse_unhonoured(snd, SECOND, server_sends=False, management=False)
    refuse_unhonoured(SETTLED, SECOND, server_sends=False, management=False)
    refuse_unhonoured(snd, FIRST, server_sends=False, management=False)


def test_the_management_reply_link_refuses_unsettled_only() -> None:
    with pytest.raises(NotImplementedByServer, match="sends its replies settled"):
        refuse_unhonoured(UNSETTLED, FIRST, server_sends=True, management=True)
    refuse_unhonoured(SETTLED, FIRST, server_sends=True, management=True)
    refuse_unhonoured(MIXED, SECOND, server_sends=True, management=True)
