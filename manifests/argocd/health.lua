-- Argo CD health check for every magnetar.io/v1alpha1 kind: MagnetarCluster, Tenant, TopicNamespace, Topic, RetentionPolicy.
-- Argo CD runs this with gopher-lua (Lua 5.1) and the object as the global `obj`.
-- argocd-cm maps each kind to this one script: every kind follows the same status contract
-- (observedGeneration + Ready/Reconciling/Stalled conditions), so one script serves them all.
local hs = {}

-- Reasons the operator gives with Ready=False that retrying will not fix: the user must change
-- the spec (or remove a conflicting CR). The operator also sets Stalled=True for these; the list
-- covers a status written before Stalled was (e.g. by an older operator). Anything else with
-- Ready=False is a transient failure the operator keeps retrying (ClusterUnreachable,
-- TenantMissing, ...), which Argo CD should show as Progressing, not Degraded.
local permanent = {
  ResourceConflict = true,  -- another resource already manages the same Pulsar object
  NotSupported = true,      -- an impossible change, e.g. fewer partitions
  AdminApiRejected = true,  -- the admin API refused the request as invalid (4xx)
  InvalidSpec = true,       -- the spec cannot be used as written
  PropagationIncomplete = true, -- a RetentionPolicy could not be applied to a stalled user
  ConnectionNotAllowed = true,  -- the operator's configuration refuses the inline connection.adminUrl
  Orphaned = true,          -- released after a bounded wait, the Pulsar object left behind
}

local function condition(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return fallback
end

-- Paused first: a paused object is deliberately left alone, whatever its last status says.
-- The same values as the operator's is_true(): true/1/yes/on, any case, surrounding blanks ignored.
local truthy = { ["true"] = true, ["1"] = true, ["yes"] = true, ["on"] = true }
local annotations = obj.metadata and obj.metadata.annotations
local paused = annotations and annotations["magnetar.io/paused"]
if type(paused) == "string" and truthy[string.lower((string.gsub(paused, "^%s*(.-)%s*$", "%1")))] then
  hs.status = "Suspended"
  hs.message = "Reconciliation paused (annotation magnetar.io/paused=true)"
  return hs
end

local status = obj.status
if status == nil or status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

-- Conditions describe the generation the operator last saw; until it has seen the current spec
-- they say nothing about it (an old Ready=True must not make a fresh change look done).
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = status.conditions
local ready = condition(conditions, "Ready")
local stalled = condition(conditions, "Stalled")
local reconciling = condition(conditions, "Reconciling")

if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled, "Stalled")
  return hs
end

-- The operator's own word comes before the reason table: some reasons are transient or
-- permanent depending on the case (PropagationIncomplete), and Reconciling=True says which.
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(reconciling, "Reconciling")
  return hs
end

if ready ~= nil and ready.status == "False" and permanent[ready.reason or ""] then
  hs.status = "Degraded"
  hs.message = describe(ready, "Not ready")
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

-- Ready=False with a transient reason, Ready=Unknown, or no Ready condition yet.
hs.status = "Progressing"
hs.message = describe(ready, "Waiting for the Ready condition")
return hs
