// Small builders for the KubeNPU dashboards (plain Grafana JSON model, no external library).
// Render: jsonnet -J deploy/grafana deploy/grafana/<name>.jsonnet > deploy/grafana/<name>.json
{
  datasource:: { type: 'prometheus', uid: '${datasource}' },

  // A Prometheus query. `instant` for tables that show one value per series.
  target(expr, legend='', instant=false, refId='A'):: {
    datasource: $.datasource,
    expr: expr,
    legendFormat: legend,
    refId: refId,
  } + (if instant then { instant: true, range: false, format: 'table' } else {}),

  // A panel's unit for the series of one query (refId), where a panel mixes units.
  unitOf(refId, unit):: {
    matcher: { id: 'byFrameRefID', options: refId },
    properties: [{ id: 'unit', value: unit }],
  },

  // `units`: refId -> unit, for the queries whose unit is not the panel's.
  timeseries(title, targets, unit, pos, description='', units={}):: {
    type: 'timeseries',
    title: title,
    description: description,
    datasource: $.datasource,
    gridPos: pos,
    targets: targets,
    fieldConfig: {
      defaults: { unit: unit, custom: { fillOpacity: 10, showPoints: 'never' } },
      overrides: [$.unitOf(r, units[r]) for r in std.objectFields(units)],
    },
    options: {
      legend: { displayMode: 'table', placement: 'right', calcs: ['mean', 'max'] },
      tooltip: { mode: 'multi', sort: 'desc' },
    },
  },

  // A table of instant values, one row per label set. `columns`: refId -> [name, unit] of the
  // query's value column (Grafana calls it `Value`, or `Value #refId` when there are several
  // queries); `hide` lists label columns not worth showing.
  table(title, targets, pos, columns={}, hide=['Time'], description=''):: {
    local valueOf(r) = if std.length(targets) > 1 then 'Value #' + r else 'Value',
    type: 'table',
    title: title,
    description: description,
    datasource: $.datasource,
    gridPos: pos,
    targets: targets,
    fieldConfig: {
      defaults: {},
      overrides: [
        {
          matcher: { id: 'byName', options: columns[r][0] },
          properties: [{ id: 'unit', value: columns[r][1] }],
        }
        for r in std.objectFields(columns)
      ],
    },
    options: { showHeader: true },
    transformations: [
      { id: 'merge', options: {} },
      {
        id: 'organize',
        options: {
          excludeByName: { [h]: true for h in hide },
          renameByName: { [valueOf(r)]: columns[r][0] for r in std.objectFields(columns) },
        },
      },
    ],
  },

  pos(x, y, w, h):: { x: x, y: y, w: w, h: h },

  // A row heading the panels below it, across the board. No queries of its own: `targets` is
  // empty, so the checks that read every panel's targets pass over it.
  row(title, y):: {
    type: 'row',
    title: title,
    collapsed: false,
    gridPos: $.pos(0, y, 24, 1),
    panels: [],
    targets: [],
  },

  // Template variables: a Prometheus data source, then label filters read from `metric`.
  variables(names, metric):: [{
    name: 'datasource',
    label: 'Data source',
    type: 'datasource',
    query: 'prometheus',
  }] + [
    {
      name: n,
      label: n,
      type: 'query',
      datasource: $.datasource,
      query: { query: 'label_values(%s, %s)' % [metric, n], refId: n },
      definition: 'label_values(%s, %s)' % [metric, n],
      includeAll: true,
      allValue: '.*',
      multi: true,
      current: { selected: true, text: ['All'], value: ['$__all'] },
      refresh: 2,
      sort: 1,
    }
    for n in names
  ],

  dashboard(uid, title, description, variables, panels):: {
    uid: uid,
    title: title,
    description: description,
    tags: ['kubenpu'],
    editable: true,
    schemaVersion: 39,
    time: { from: 'now-1h', to: 'now' },
    refresh: '30s',
    templating: { list: variables },
    panels: [panels[i] { id: i + 1 } for i in std.range(0, std.length(panels) - 1)],
  },
}
