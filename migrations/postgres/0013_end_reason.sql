-- Why a batch ended without succeeding (api::EndReason): 1 expired in the
-- queue, 2 stock-out, 3 quota, 4 infrastructure failure, 5 its own work
-- failed, 6 cancelled. The API's error code, the metrics label and the
-- console's badge come from it, never from the message's words.
alter table batches add column end_reason integer;

-- Batches that ended before it existed get the reason their state, their
-- provisioning (2 expired, 3 rejected) and the messages flexq wrote say.
update batches set end_reason = case
    when state = 4 then 6
    when provisioning = 2 then 1
    when provisioning = 3 and state_message like 'RESOURCE_EXHAUSTED: quota%' then 3
    when provisioning = 3 then 2
    when state_message like 'Node % was lost:%'
        or state_message like 'The agent of node % restarted%'
        or state_message like '%no longer declares%' then 4
    else 5
end
where state in (4, 6);
