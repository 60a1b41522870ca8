"""Probation rules (issue 9 item 6): exact operating characteristics and their guarantees."""

from __future__ import annotations

import re

import pytest

from vtrm_gate.harness import WorkspaceConfig
from vtrm_gate.stats import (
    EContinueRule,
    EHarmRule,
    GateParams,
    WNetRule,
    probation_rule,
    probe_oc,
    settled_oc,
)


@pytest.mark.parametrize("e_start", [1.0, 2.25, 5.0625])
@pytest.mark.parametrize("discordance", [0.2, 0.5, 1.0])
def test_e_continue_keeps_a_neutral_candidate_at_most_e_start_over_e_confirm(e_start,
                                                                             discordance):
    # Ville from the gate's E+: P(sup E+ >= e_confirm) <= e_start / e_confirm.
    oc = probe_oc(EContinueRule(e_start), 0.5, discordance, 40)
    assert oc.p_keep <= e_start / GateParams().e_confirm
    worse = probe_oc(EContinueRule(e_start), 0.3, discordance, 40)
    assert worse.p_keep <= oc.p_keep


def test_w_net_probe_keeps_a_neutral_candidate_about_half_the_time():
    for d in (0.2, 0.5):
        assert 0.5 < probe_oc(WNetRule(0), 0.5, d, 40).p_keep < 0.6
    assert probe_oc(WNetRule(0), 0.5, 0.5, 0).p_keep == 1.0  # empty probe: W - L = 0
    assert probe_oc(WNetRule(0), 0.5, 0.5, 40).expected_units == pytest.approx(40)


def test_e_harm_rolls_back_a_not_worse_candidate_at_most_one_over_e_reject():
    for d in (0.2, 0.5, 1.0):
        assert 1 - probe_oc(EHarmRule(), 0.5, d, 40).p_keep <= 1 / GateParams().e_reject


def test_end_to_end_leak_of_neutral_candidates_small_ladders():
    # Exact gate + probe on 20 + 20 units: e_continue applies a neutral candidate with
    # probability <= 1/e_confirm (the ACCEPT guarantee), the w_net bet does not promise that.
    e = settled_oc("e_continue", 0.5, 0.5, n_gate=20, n_probe=20)
    w = settled_oc("w_net", 0.5, 0.5, n_gate=20, n_probe=20)
    assert e.p_applied <= 1 / GateParams().e_confirm
    assert e.p_kept < w.p_kept <= w.p_provisional
    assert e.p_accept == w.p_accept
    good_e = settled_oc("e_continue", 0.9, 0.5, n_gate=20, n_probe=20)
    good_w = settled_oc("w_net", 0.9, 0.5, n_gate=20, n_probe=20)
    assert good_e.p_applied > 0.8 and good_e.expected_probe_units < good_w.expected_probe_units


def test_rule_is_a_validated_workspace_setting():
    assert WorkspaceConfig().probation_rule == "e_continue"  # init's default (issue 27)
    assert WorkspaceConfig(probation_rule="w_net").probation_rule == "w_net"
    assert WorkspaceConfig(probation_rule="e_continue").probation_rule == "e_continue"
    with pytest.raises(ValueError, match=re.escape("probation_rule must be w_net | e_continue")):
        WorkspaceConfig(probation_rule="vote")
    with pytest.raises(ValueError, match="probation_rule must be one of"):
        probation_rule("vote")
