// Draws the report's charts with uPlot from the JSON the page carries.
// Markers (checkpoints, restarts, failures...) and spans (a disabled handler)
// are drawn by a small uPlot plugin; hovering near one names it under the chart.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var styles = data.markerStyles;
  var plots = [];
  // Each chart's y axis as last drawn, by chart id: its scale and its tick labels
  // (for the tests, and anyone checking a page in the console).
  var axes = {};
  // Each chart's shaded spans as last drawn, by chart id, in canvas pixels (likewise).
  var shaded = {};
  // Rounds and periods are whole numbers: ticks at 1, 2, 5, 10, 20, 50...
  var WHOLE = [];
  for (var scale = 1; scale <= 1e12; scale *= 10) WHOLE.push(scale, 2 * scale, 5 * scale);

  // A figure as the page shows it: at most `digits` significant digits, no trailing
  // zeros, an exponent for the very large and the very small (1e-6, not 0.000001),
  // and its unit: "2%", "5 ms".
  function format(v, unit, digits) {
    if (v == null || !isFinite(v)) return "";
    var size = Math.abs(v), text;
    if (size !== 0 && (size >= 1e6 || size < 1e-3)) {
      var parts = v.toExponential(digits - 1).split("e");
      text = String(+parts[0]) + "e" + String(+parts[1]);
    } else {
      text = String(+v.toPrecision(digits));
    }
    if (!unit) return text;
    return unit === "%" ? text + "%" : text + " " + unit;
  }

  // A log scale spans whole decades, from the power of ten at or under its lowest
  // value to the one at or over its highest. uPlot's log ticks count up from the
  // scale's minimum in steps of its decade: from a minimum that is not a multiple
  // of that step (0.0099: the first step lands on 0.011), the step becomes a value
  // its table of decimals lacks, rounds to 0, and the ticks never end ("RangeError:
  // Invalid array length", a blank chart). A power of ten is always such a multiple.
  function logRange(min, max) {
    if (!(min > 0) || !(max > 0)) return [1, 10];  // nothing to draw: any decade
    return uPlot.rangeLog(min, max, 10, true);
  }

  function range(spec) {
    var threshold = spec.threshold ? spec.threshold.y : null;
    if (spec.logY) {
      return function (u, min, max) {
        if (threshold > 0) {  // the budget line stays in sight
          min = min > 0 ? Math.min(min, threshold) : threshold;
          max = max > 0 ? Math.max(max, threshold * 1.1) : threshold * 1.1;
        }
        return logRange(min, max);
      };
    }
    if (threshold == null) return undefined;
    return function (u, min, max) {
      return [Math.min(min, 0), Math.max(max, threshold * 1.1)];
    };
  }

  // A span covers its periods [from, to): the x axis reaches the end of the last one, so
  // that a state the run (or the bench) ended in is shaded, not drawn past the plot.
  function xRange(spec) {
    var ends = (spec.spans || []).map(function (span) { return span.to; });
    if (!ends.length) return undefined;
    var end = Math.max.apply(null, ends);
    return function (u, min, max) { return [min, Math.max(max, end)]; };
  }

  function place(u, x) {
    return Math.round(u.valToPos(x, "x", true));
  }

  function annotations(spec) {
    var markers = spec.runMarkers ? data.runMarkers : spec.markers;
    return {
      hooks: {
        drawClear: [
          function (u) {
            var ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
            shaded[spec.id] = [];
            (spec.spans || []).forEach(function (span) {
              var style = styles[span.kind] || {colour: "#999999"};
              var left = place(u, span.from), right = place(u, span.to);
              shaded[spec.id].push({
                kind: span.kind, left: left, right: right, top: top, height: height,
                plotLeft: u.bbox.left,
              });
              ctx.save();
              ctx.globalAlpha = 0.15;
              ctx.fillStyle = style.colour;
              ctx.fillRect(left, top, Math.max(right - left, 2), height);
              ctx.restore();
            });
          },
        ],
        draw: [
          function (u) {
            var ctx = u.ctx, top = u.bbox.top, bottom = top + u.bbox.height;
            markers.forEach(function (marker) {
              var style = styles[marker.kind] || {colour: "#000000", dash: []};
              var x = place(u, marker.x);
              if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
              ctx.save();
              ctx.strokeStyle = style.colour;
              ctx.lineWidth = 1.5 * devicePixelRatio;
              ctx.setLineDash((style.dash || []).map(function (d) { return d * devicePixelRatio; }));
              ctx.beginPath();
              ctx.moveTo(x, top);
              ctx.lineTo(x, bottom);
              ctx.stroke();
              ctx.restore();
            });
            if (spec.threshold) {
              var y = Math.round(u.valToPos(spec.threshold.y, "y", true));
              ctx.save();
              ctx.strokeStyle = spec.threshold.colour;
              ctx.lineWidth = 2 * devicePixelRatio;
              ctx.setLineDash([8 * devicePixelRatio, 4 * devicePixelRatio]);
              ctx.beginPath();
              ctx.moveTo(u.bbox.left, y);
              ctx.lineTo(u.bbox.left + u.bbox.width, y);
              ctx.stroke();
              ctx.restore();
            }
          },
        ],
        setCursor: [
          function (u) {
            var note = document.getElementById(spec.id + "-hover");
            if (!note || u.cursor.left == null || u.cursor.left < 0) return;
            var near = markers.filter(function (marker) {
              return Math.abs(u.valToPos(marker.x, "x") - u.cursor.left) <= 4;
            });
            note.textContent = near.map(function (marker) { return marker.label; }).join(" · ");
          },
        ],
      },
    };
  }

  function options(spec, width) {
    var xUnit = spec.xUnit || "", yUnit = spec.yUnit || "";
    var series = [{
      label: spec.xLabel,
      value: function (u, v) { return format(v, xUnit, 6); },
    }];
    spec.series.forEach(function (s) {
      series.push({
        label: s.label,
        stroke: s.colour,
        fill: s.fill || undefined,
        width: s.width || 1.5,
        dash: s.dash || undefined,
        spanGaps: true,
        points: {show: !!s.points, size: 5},
        value: function (u, v) { return v == null ? "-" : format(v, yUnit, 4); },
      });
    });
    // Ticks are round numbers (1025, 0.0125): enough digits for them, never noise.
    function yTicks(u, splits) {
      var labels = splits.map(function (v) { return format(v, yUnit, 6); });
      axes[spec.id] = {min: u.scales.y.min, max: u.scales.y.max, ticks: labels};
      return labels;
    }
    return {
      width: width,
      height: spec.height || 260,
      series: series,
      bands: (spec.bands || []).map(function (b) {
        return {series: [b[0], b[1]], fill: b[2]};
      }),
      scales: {
        x: {time: false, range: xRange(spec)},
        y: {distr: spec.logY ? 3 : 1, range: range(spec)},
      },
      axes: [
        {
          label: spec.xLabel,
          incrs: WHOLE,
          values: function (u, splits) {
            return splits.map(function (v) { return format(v, xUnit, 6); });
          },
        },
        {label: spec.yLabel, size: 80, values: yTicks},
      ],
      cursor: {drag: {x: true, y: false}},
      legend: {live: true},
      plugins: [annotations(spec)],
    };
  }

  var drawn = 0;
  data.charts.forEach(function (spec) {
    var box = document.getElementById(spec.id);
    try {
      var columns = [spec.x].concat(spec.series.map(function (s) { return s.values; }));
      var width = Math.max(box.clientWidth, 320);
      plots.push({box: box, plot: new uPlot(options(spec, width), columns, box)});
      drawn += 1;
    } catch (error) {
      box.textContent = "This chart could not be drawn: " + error;
      console.error("chart " + spec.id + ": " + error);
    }
  });

  window.addEventListener("resize", function () {
    plots.forEach(function (p) {
      p.plot.setSize({width: Math.max(p.box.clientWidth, 320), height: p.plot.height});
    });
  });
  window.eventbusReport = {format: format, logRange: logRange, axes: axes, spans: shaded};
  document.body.dataset.charts = String(drawn);
  document.body.dataset.ready = "1";
})();
